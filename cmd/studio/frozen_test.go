package main_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// frozenProbe is one request sent while the database is frozen.
type frozenProbe struct {
	name, method, path, token string
	body                      func() (io.Reader, string) // body and its Content-Type
	status                    int
	slug                      string        // "" when any problem type will do (heavy: database-unavailable or heavy-request-timed-out)
	bound                     time.Duration // the bound the path keeps (SECURITY.md)
}

func jsonBody(v string) func() (io.Reader, string) {
	return func() (io.Reader, string) { return strings.NewReader(v), "application/json" }
}

func pluginBody() (io.Reader, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, _ := mw.CreateFormFile("file", "p.jar")
	_, _ = fw.Write([]byte("plugin"))
	_ = mw.Close()
	return &b, mw.FormDataContentType()
}

// sendProbe sends p to base and returns the response and how long it took;
// a request still unanswered after limit is an error.
func sendProbe(base string, p frozenProbe, limit time.Duration) (*response, time.Duration, error) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var body io.Reader
	ct := ""
	if p.body != nil {
		body, ct = p.body()
	}
	req, err := http.NewRequestWithContext(ctx, p.method, base+p.path, body)
	if err != nil {
		return nil, 0, err
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if p.token != "" {
		req.Header.Set("Authorization", "Bearer "+p.token)
	}
	start := time.Now()
	resp, err := client.Do(req)
	if err != nil {
		return nil, time.Since(start), err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	took := time.Since(start)
	if err != nil {
		return nil, took, err
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, took, nil
}

// TestFrozenDatabase stops every process of the database with SIGSTOP —
// a database that hangs rather than refuses: connections stay open, new
// ones are accepted by the kernel, nothing answers — under a replica that
// has warm connections to it. Every route that touches the database
// answers within the bound it keeps (SECURITY.md: a heavy request its time
// bound, every other path a few seconds), with the same 503 problem as for
// a database that is down (sign-in: sign-in-unavailable), never a hang, a
// 500 or internal text. After SIGCONT every route serves again on its own.
func TestFrozenDatabase(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	admin := pgtest.Pool(t, c.URL("postgres"), 1)
	if _, err := admin.Exec(context.Background(), `CREATE DATABASE studio`); err != nil {
		t.Fatal(err)
	}
	admin.Close()
	const heavyTime = 8 * time.Second
	ht := heavyTime.String()
	procs := studioOn(t, c.URL("studio"), 1, "-sql-console-time", ht, "-export-time", ht, "-history-time", ht, "-flow-time", ht,
		"-heartbeat", "1s")
	base := procs[0].URL
	// Thaw before the cluster's own cleanup stops it (cleanups run last
	// registered first).
	t.Cleanup(c.Thaw)

	const few = 5 * time.Second // the bound of every path that is not heavy
	probes := []frozenProbe{
		{"sign-in", http.MethodPost, "/api/session", "", jsonBody(`{"username":"bob","password":"studio"}`), 503, "sign-in-unavailable", few},
		{"sign-in wrong password", http.MethodPost, "/api/session", "", jsonBody(`{"username":"carol","password":"nope"}`), 503, "sign-in-unavailable", few},
		{"operator view", http.MethodGet, "/api/limits", "alice-token", nil, 503, "database-unavailable", few},
		{"upload", http.MethodPost, "/api/plugins", "carol-token", pluginBody, 503, "database-unavailable", few},
		{"node queues", http.MethodGet, "/api/nodes/none/queues", "alice-token", nil, 503, "database-unavailable", few},
		{"audit page sign-in", http.MethodPost, "/audit", "", func() (io.Reader, string) {
			return strings.NewReader("token=alice-token"), "application/x-www-form-urlencoded"
		}, 503, "", few},
		{"console", http.MethodPost, "/api/sql", "alice-token", jsonBody(`{"sql":"SELECT count(*) FROM audit_event"}`), 503, "", heavyTime},
		{"audit history", http.MethodGet, "/api/audit?size=5", "alice-token", nil, 503, "", heavyTime},
		{"event history", http.MethodGet, "/api/events?size=5", "bob-token", nil, 503, "", heavyTime},
		{"export", http.MethodGet, "/api/audit/export", "bob-token", nil, 503, "", heavyTime},
		{"flow graph", http.MethodGet, "/api/flow", "carol-token", nil, 503, "", heavyTime},
		{"readiness", http.MethodGet, "/readyz", "", nil, 503, "", few},
	}
	// Every route answers before the freeze, all at once, so the replica's
	// pools hold a warm connection for each of them when the database
	// hangs: a path with no bound of its own would wait on one for ever
	// (pgxpool pings a connection idle for a second, without a deadline of
	// its own).
	var warm sync.WaitGroup
	for _, p := range probes {
		warm.Add(1)
		go func() {
			defer warm.Done()
			r, _, err := sendProbe(base, p, time.Minute)
			if err != nil || r.Status >= 500 {
				t.Errorf("%s before the freeze: %v %v", p.name, r, err)
			}
		}()
	}
	warm.Wait()
	if t.Failed() {
		t.FailNow()
	}
	time.Sleep(1100 * time.Millisecond)

	// A heavy request already past its token lookup and its permits, its
	// statement running when the database freezes, keeps its time bound.
	const marker = "probe-frozen-running"
	obs := pgtest.Pool(t, c.URL("studio"), 1)
	runningAnswer := make(chan answerOf, 1)
	go func() {
		p := frozenProbe{name: "console running at the freeze", method: http.MethodPost, path: "/api/sql", token: "carol-token",
			body: jsonBody(`{"sql":"SELECT pg_sleep(3), '` + marker + `'"}`)}
		r, took, err := sendProbe(base, p, heavyTime+30*time.Second)
		runningAnswer <- answerOf{r, took, err}
	}()
	wait.For(t, 10*time.Second, "the console statement running", func() bool { return running(t, obs, marker) == 1 })
	obs.Close()

	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	answers := make([]answerOf, len(probes))
	var wg sync.WaitGroup
	for i, p := range probes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, took, err := sendProbe(base, p, p.bound+30*time.Second)
			answers[i] = answerOf{r, took, err}
		}()
	}
	wg.Wait()
	// Liveness does not touch the database.
	if r, took, err := sendProbe(base, frozenProbe{method: http.MethodGet, path: "/healthz"}, few); err != nil || r.Status != http.StatusOK {
		t.Errorf("/healthz with the database frozen: %v %v after %v", r, err, took)
	}
	var report strings.Builder
	for i, p := range probes {
		a := answers[i]
		if a.err != nil {
			t.Errorf("%s: no answer with the database frozen: %v after %v", p.name, a.err, a.took)
			continue
		}
		fmt.Fprintf(&report, "\n  %-24s %d %-28s %v", p.name, a.r.Status, typeOf(a.r), a.took.Round(10*time.Millisecond))
		noInternalText(t, p.name+" with the database frozen", a.r)
		if a.r.Status != p.status {
			t.Errorf("%s with the database frozen: %d %s, want %d", p.name, a.r.Status, a.r.Body, p.status)
			continue
		}
		if p.slug != "" {
			a.r.problemOf(t, p.status, p.slug)
		} else if p.path != "/readyz" && p.path != "/audit" && a.r.Header.Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s with the database frozen: %s %s", p.name, a.r.Header.Get("Content-Type"), a.r.Body)
		}
		// A behavioural bound, generous for a loaded machine: the path's
		// own bound plus a few seconds, not the minutes of a hang.
		if a.took > p.bound+5*time.Second {
			t.Errorf("%s with the database frozen answered after %v; its bound is %v", p.name, a.took, p.bound)
		}
	}
	// The request running at the freeze holds permits: its answer waits
	// for their release as long as the database could still answer
	// within the limiters' Timeout (5 s, less a sixteenth), once for all
	// of them, and then goes out without it.
	const releaseWait = 5 * time.Second
	ra := <-runningAnswer
	switch {
	case ra.err != nil:
		t.Errorf("the console statement running at the freeze: no answer: %v after %v", ra.err, ra.took)
	case ra.r.Status != http.StatusServiceUnavailable || ra.took > heavyTime+releaseWait+5*time.Second:
		t.Errorf("the console statement running at the freeze: %d %s after %v; its time bound is %v, its releases' wait %v",
			ra.r.Status, ra.r.Body, ra.took, heavyTime, releaseWait)
	default:
		noInternalText(t, "the console statement running at the freeze", ra.r)
		fmt.Fprintf(&report, "\n  %-24s %d %-28s %v (from its start)", "console running at freeze", ra.r.Status, typeOf(ra.r), ra.took.Round(10*time.Millisecond))
	}
	t.Logf("with the database frozen (%v):%s", time.Since(frozen).Round(time.Second), report.String())

	c.Thaw()
	thawed := time.Now()
	for _, p := range probes {
		wait.For(t, 30*time.Second, p.name+" serves again after SIGCONT", func() bool {
			r, _, err := sendProbe(base, p, 20*time.Second)
			if err != nil {
				return false
			}
			if r.Status >= 500 && r.Status != http.StatusServiceUnavailable {
				t.Fatalf("%s while the database thaws: %d %s", p.name, r.Status, r.Body)
			}
			return r.Status < 500
		})
	}
	t.Logf("every route served again %v after SIGCONT", time.Since(thawed).Round(10*time.Millisecond))
}

// answerOf is what a client of a probe saw: the response, or an error,
// and when.
type answerOf struct {
	r    *response
	took time.Duration
	err  error
}

// typeOf is the problem type slug of r, or its Content-Type.
func typeOf(r *response) string {
	if r.Header.Get("Content-Type") == "application/problem+json" {
		var m map[string]any
		if jsonUnmarshal(r.Body, &m) == nil {
			if s, ok := m["type"].(string); ok {
				return s[strings.LastIndexAny(s, ":/")+1:]
			}
		}
	}
	return r.Header.Get("Content-Type")
}
