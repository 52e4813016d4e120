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
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/internal/replicaset"
)

func TestMain(m *testing.M) {
	defer replicaset.Cleanup()
	pgtest.Main(m)
}

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

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// observePeak polls pg_stat_activity on its own connection and keeps the
// highest number of active statements containing marker seen at once: an
// observer independent of pglimit's tables. Call the returned function to
// stop it and read the peak.
func observePeak(t *testing.T, dbURL, marker string) (stop func() int64) {
	t.Helper()
	obs, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer obs.Close(context.Background())
		for {
			select {
			case <-quit:
				return
			default:
			}
			var n int64
			if obs.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE state = 'active'
				AND query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()`, marker).Scan(&n) == nil && n > peak.Load() {
				peak.Store(n)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}()
	return func() int64 {
		close(quit)
		<-done
		return peak.Load()
	}
}
