package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// TestConsole covers the SQL console's answers: a result, the row cap,
// statements it refuses, and the time bound.
func TestConsole(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-sql-console-rows", "100", "-sql-console-time", "1s")
	url := procs[0].URL + "/api/sql"

	r := call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": "SELECT 1 AS one, 'x' AS two"})
	if r.Status != http.StatusOK {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	if diff := cmp.Diff(map[string]any{"columns": []any{"one", "two"}, "rows": []any{[]any{float64(1), "x"}}, "bound": nil}, r.json(t)); diff != "" {
		t.Errorf("result (-want +got):\n%s", diff)
	}

	r = call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": "SELECT g FROM generate_series(1, 500) g"})
	got := r.json(t)
	if rows := r.rows(t); got["bound"] != "ROWS" || len(rows) != 100 {
		t.Fatalf("row cap: bound %v, %d rows", got["bound"], len(rows))
	}

	for name, sql := range map[string]string{
		"write":               "DELETE FROM audit_event",
		"ddl":                 "CREATE TABLE x (y int)",
		"two statements":      "SELECT 1; SELECT 2",
		"syntax":              "SELEC 1",
		"set read write":      "SET TRANSACTION READ WRITE",
		"timeout off then go": "SET statement_timeout = 0; SELECT pg_sleep(5)",
	} {
		r := call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": sql})
		r.problemOf(t, http.StatusBadRequest, "invalid-sql")
		_ = name
	}

	start := time.Now()
	// Stopped at its bound (1 s), not run to its end (60 s): 30 s tells the
	// two apart however loaded the machine.
	r = call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": "SELECT pg_sleep(60)"})
	m := r.problemOf(t, http.StatusServiceUnavailable, "heavy-request-timed-out")
	if m["endpoint"] != "sql-console" || m["bound"] != "TIME" || m["limit"] != "1s" {
		t.Errorf("timeout members: %v", m)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("a 1 s bound answered after %v", took)
	}
	// A statement that resets the timeout inside itself is still stopped.
	start = time.Now()
	r = call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": "SELECT set_config('statement_timeout', '0', true), pg_sleep(60)"})
	r.problemOf(t, http.StatusServiceUnavailable, "heavy-request-timed-out")
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("set_config inside the statement escaped the bound: %v", took)
	}
}

// TestConsoleCapAcrossReplicas runs many concurrent console queries of one
// user through three replicas and counts them in pg_stat_activity: never
// more than -sql-console-cap at once, and every refusal is the contract's
// 429.
func TestConsoleCapAcrossReplicas(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 3, "-sql-console-cap", "2", "-token-in-flight", "100")
	const marker = "console-cap-probe"
	stopObserver := observePeak(t, dbURL, marker)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	var firstRefusal sync.Once
	for i := 0; i < 30; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := send(context.Background(), http.MethodPost, procs[i%3].URL+"/api/sql", "alice-token",
				map[string]string{"sql": fmt.Sprintf("SELECT pg_sleep(1), '%s'", marker)})
			if err != nil {
				t.Error(err)
				return
			}
			switch r.Status {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
				firstRefusal.Do(func() {
					m := r.problemOf(t, http.StatusTooManyRequests, "too-many-heavy-requests")
					if m["endpoint"] != "sql-console" || m["limit"] != float64(2) || m["scope"] != "user" {
						t.Errorf("refusal members: %v", m)
					}
					if r.Header.Get("Retry-After") == "" || r.Header.Get("RateLimit-Policy") == "" {
						t.Errorf("refusal headers: %v", r.Header)
					}
				})
			default:
				t.Errorf("status %d: %s", r.Status, r.Body)
			}
		}()
	}
	wg.Wait()
	peak := stopObserver()
	t.Logf("ok %d, refused %d, peak running %d", ok.Load(), refused.Load(), peak)
	if peak > 2 {
		t.Fatalf("pg_stat_activity saw %d console queries of one user at once; cap 2", peak)
	}
	if peak < 2 || refused.Load() == 0 {
		t.Fatalf("never reached the cap (peak %d, refused %d)", peak, refused.Load())
	}
}

// TestConsoleCannotEscapeItsRole runs the service as a superuser on a
// cluster of its own: the console still logs in as a console role (of the
// user's own), so a
// statement that switches back to its session user gains nothing, and
// neither password hashes nor server files can be read.
func TestConsoleCannotEscapeItsRole(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 1)
	if _, err := admin.Exec(context.Background(), `CREATE DATABASE app`); err != nil {
		t.Fatal(err)
	}
	procs := studioOn(t, cluster.URL("app"), 1)
	url := procs[0].URL + "/api/sql"

	// alice logs in as a console role of her own (issue 27).
	r := call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": "SELECT session_user::text, current_user::text"})
	rows := r.rows(t)
	if len(rows) != 1 {
		t.Fatalf("console session: %s", r.Body)
	}
	who := as[[]any](t, rows[0], "row")
	if user, _ := who[0].(string); !strings.HasPrefix(user, "studio_console_") || who[1] != user {
		t.Fatalf("console session %v, want a studio_console_ role of alice's own", who)
	}
	for _, sql := range []string{
		`SELECT set_config('role', session_user, true), query_to_xml('SELECT password_hash FROM app_user', true, false, '')`,
		`SELECT password_hash FROM app_user`,
		`SELECT digest FROM api_token`,
		`SELECT pg_read_file('/etc/passwd')`,
		`SELECT * FROM pglimit.heavy_permit`,
	} {
		r := call(t, http.MethodPost, url, "alice-token", map[string]string{"sql": sql})
		m := r.problemOf(t, http.StatusBadRequest, "invalid-sql")
		if m["sqlstate"] != "42501" {
			t.Errorf("%s: %v, want permission denied (42501)", sql, m)
		}
	}
	// A console URL that logs in as a superuser is refused at start-up.
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-database-url", cluster.URL("app"), "-sql-console-url", cluster.URL("app"), "-addr", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "superuser") {
		t.Fatalf("a superuser console URL: err %v, output %s", err, out)
	}
}
