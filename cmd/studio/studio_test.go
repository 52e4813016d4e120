package main_test

// Black-box tests of the reference service: the studio binary runs as
// several replicas (child processes) on one database, and the tests speak
// HTTP to them as any client would. They pin the contract of
// REFERENCE-SERVICE.md: flag names, routes, problem type slugs, the export
// mark.

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

func TestMain(m *testing.M) { pgtest.Main(m, replicaset.Cleanup) }

// studioMigration is the service's own schema, so a test database is
// cloned with it already applied.
var studioMigration = pgtest.Migration{FS: studioschema.FS(), Table: studioschema.VersionTable, LockID: studioschema.LockID}

// studio starts n replicas on a fresh database with demo data and the
// given flags; they are stopped when the test ends, and their logs printed
// if it failed.
func studio(t *testing.T, n int, args ...string) ([]*replicaset.Proc, string) {
	t.Helper()
	url := pgtest.URL(t, studioMigration)
	return studioOn(t, url, n, args...), url
}

func studioOn(t *testing.T, url string, n int, args ...string) []*replicaset.Proc {
	t.Helper()
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	procs, err := replicaset.Start(ctx, replicaset.Options{
		Binary: bin, N: n, DatabaseURL: url,
		Args:   append([]string{"-demo"}, args...),
		LogDir: t.TempDir(),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, p := range procs {
			p.Stop()
			if t.Failed() {
				t.Logf("log of %s:\n%s", p.Name, p.Tail(3000))
			}
		}
	})
	return procs
}

// response is what a client saw.
type response struct {
	Status int
	Header http.Header
	Body   []byte
}

func (r *response) json(t *testing.T) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// problemOf checks the response is problem+json with the given status and
// slug, and returns its members.
func (r *response) problemOf(t *testing.T, status int, slug string) map[string]any {
	t.Helper()
	if r.Status != status {
		t.Fatalf("status %d, want %d: %s", r.Status, status, r.Body)
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/problem+json" {
		t.Fatalf("Content-Type %q, want application/problem+json: %s", ct, r.Body)
	}
	m := r.json(t)
	typ, _ := m["type"].(string)
	if !strings.HasSuffix(typ, ":"+slug) && !strings.HasSuffix(typ, "/"+slug) {
		t.Fatalf("problem type %q, want one ending in %q", typ, slug)
	}
	for _, member := range []string{"title", "status", "detail"} {
		if _, ok := m[member]; !ok {
			t.Fatalf("problem without %q: %s", member, r.Body)
		}
	}
	return m
}

var client = &http.Client{Timeout: 2 * time.Minute}

func call(t *testing.T, method, url, token string, body any) *response {
	t.Helper()
	resp, err := send(context.Background(), method, url, token, body)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func send(ctx context.Context, method, url, token string, body any) (*response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		rd = strings.NewReader(b)
	case []byte:
		rd = bytes.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		rd = bytes.NewReader(j)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

// envWithout returns the environment without the named variables.
func envWithout(names ...string) []string {
	var out []string
outer:
	for _, kv := range os.Environ() {
		for _, n := range names {
			if strings.HasPrefix(kv, n+"=") {
				continue outer
			}
		}
		out = append(out, kv)
	}
	return out
}

// as returns v as a T, or fails the test saying what it got: an unexpected
// answer fails the test with a message, never a panic.
func as[T any](t *testing.T, v any, what string) T {
	t.Helper()
	x, ok := v.(T)
	if !ok {
		t.Fatalf("%s: %T %v, want a %T", what, v, v, *new(T))
	}
	return x
}

// rows returns the rows of a SQL console answer; anything but a 200 whose
// rows are a list fails the test.
func (r *response) rows(t *testing.T) []any {
	t.Helper()
	if r.Status != http.StatusOK {
		t.Fatalf("console: %d %s", r.Status, r.Body)
	}
	return as[[]any](t, r.json(t)["rows"], "console rows")
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// observePeak polls pg_stat_activity on its own connection and keeps the
// highest number of active statements containing marker seen at once: an
// observer independent of pglimit's tables (internal/harness/activity). Call the
// returned function to stop it and read the peak; an observer that cannot
// read the statements of every role in the database fails the test.
func observePeak(t *testing.T, dbURL, marker string) (stop func() int64) {
	t.Helper()
	w, err := activity.Watch(context.Background(), dbURL, marker)
	if err != nil {
		t.Fatal(err)
	}
	return func() int64 {
		t.Helper()
		peak, _, err := w.Stop()
		if err != nil {
			t.Fatalf("observer: %v", err)
		}
		return int64(peak)
	}
}

// running returns how many statements containing marker run now in q's
// database (internal/harness/activity); a blind observer fails the test.
func running(t *testing.T, q activity.Querier, marker string) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	texts, err := activity.Running(ctx, q, marker)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	return len(texts)
}
