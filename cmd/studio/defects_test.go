package main_test

// Tests of the smaller defects of issue 11, section 6.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// TestClientGoneIsNotAServerError: a client that goes away while its
// request waits on the database — its token lookup, its permit claim, its
// sign-in throttle check, each held up by a table lock the test takes — is
// not a server error: the service logs it at debug level and writes no
// 500 and no ERROR (or database-unavailable WARN) line.
func TestClientGoneIsNotAServerError(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-log-level", "debug")
	p := procs[0]
	locker := pgtest.Pool(t, dbURL, 1)
	obs := pgtest.Pool(t, dbURL, 1)
	for i, tc := range []struct {
		name, table, method, path, token string
		body                             any
	}{
		{"token lookup", "api_token", http.MethodGet, "/api/limits", "alice-token", nil},
		{"permit claim", "pglimit.slot", http.MethodGet, "/api/flow", "bob-token", nil},
		{"sign-in check", "pglimit.login_attempt", http.MethodPost, "/api/session", "", map[string]string{"username": "carol", "password": "nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `LOCK TABLE `+tc.table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			reqCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := send(reqCtx, tc.method, p.URL+tc.path, tc.token, tc.body)
				done <- err
			}()
			wait.For(t, 10*time.Second, "the request waiting on the lock", func() bool {
				// This database's locks only: every test database is a
				// clone of one template, so its tables have the same OIDs
				// as every other test's on a shared server.
				return count(obs, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass
					AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`, tc.table) > 0
			})
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the request answered although its client went away")
			}
			// The service sees the client gone and says so at debug level.
			wait.For(t, 10*time.Second, "the debug line of the canceled request", func() bool {
				return strings.Count(p.Tail(1<<20), "client went away") > i
			})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	log := p.Tail(1 << 20)
	for _, line := range strings.Split(log, "\n") {
		request := strings.Contains(line, `"path":`)
		if strings.Contains(line, `"level":"ERROR"`) || request && strings.Contains(line, `"level":"WARN"`) {
			t.Errorf("a client that went away was logged as a server failure: %s", line)
		}
	}
}

// TestConsolePoolFollowsTheSharedCaps: the console's own pool (a login as
// studio_console) is no hidden per-replica limit under the shared permits.
// With an installation cap of 4 (-pool-max-conns 16) and a per-user cap of
// 2, three users send two long console statements each to one replica:
// pg_stat_activity sees exactly 4 run at once — the installation cap —
// and the other 2 are refused 429 with scope installation. Before, the
// pool held max(2, -sql-console-cap) = 2 connections, so only 2 ran and
// the other granted statements queued for a connection inside their time
// bound.
func TestConsolePoolFollowsTheSharedCaps(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	admin := pgtest.Pool(t, c.URL("postgres"), 1)
	if _, err := admin.Exec(context.Background(), `CREATE DATABASE studio`); err != nil {
		t.Fatal(err)
	}
	procs := studioOn(t, c.URL("studio"), 1, "-pool-max-conns", "16", "-sql-console-cap", "2", "-sql-console-time", "30s")
	url := procs[0].URL + "/api/sql"
	r := call(t, http.MethodPost, url, "alice-token", console("SELECT session_user"))
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), "studio_console") {
		t.Fatalf("the console does not log in as studio_console, so its own pool is not under test: %d %s", r.Status, r.Body)
	}
	const marker = "probe-console-pool"
	stop := observePeak(t, c.URL("studio"), marker)
	var (
		mu       sync.Mutex
		statuses = map[string]int{}
		wg       sync.WaitGroup
	)
	for _, token := range []string{"alice-token", "alice-token", "bob-token", "bob-token", "carol-token", "carol-token"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := send(context.Background(), http.MethodPost, url, token, console("SELECT pg_sleep(5), '"+marker+"'"))
			if err != nil {
				t.Error(err)
				return
			}
			key := fmt.Sprint(r.Status)
			if r.Status == http.StatusTooManyRequests {
				key += " " + fmt.Sprint(r.json(t)["scope"])
			}
			mu.Lock()
			statuses[key]++
			mu.Unlock()
		}()
	}
	wg.Wait()
	peak := stop()
	t.Logf("answers %v, peak running %d", statuses, peak)
	if peak != 4 {
		t.Errorf("pg_stat_activity saw at most %d console statements at once; the installation cap is 4", peak)
	}
	if statuses["200"] != 4 || statuses["429 installation"] != 2 {
		t.Errorf("answers %v, want 4 × 200 and 2 × 429 scope installation", statuses)
	}
}

// TestExportFailuresAreAudited: an export that does not end with its mark
// still leaves an audit.export event, partial, with what stopped it: the
// time bound before any row (503: bound TIME, 0 rows), the database lost
// mid-stream (its backend terminated: reason database-unavailable), the
// client gone mid-stream (reason client-gone).
//
// The time bound is reached by a replica with a 1 s bound, whose export
// waits on a lock the test holds; the mid-stream cases run on a second
// replica of the same database whose bound is far away, so the bound can
// never end them first however slowly a loaded machine runs the test (they
// end when the test ends them, and the audit event must say how).
func TestExportFailuresAreAudited(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-export-time", "1s")
	base := procs[0].URL
	unbounded := studioOn(t, dbURL, 1, "-export-time", "10m")[0].URL
	obs := pgtest.Pool(t, dbURL, 2)
	ctx := context.Background()
	lastEvent := func() (id int64) {
		if err := obs.QueryRow(ctx, `SELECT coalesce(max(id), 0) FROM audit_event`).Scan(&id); err != nil {
			t.Fatal(err)
		}
		return id
	}
	// exportAfter is actor's first audit.export event after event id after.
	exportAfter := func(actor string, after int64) map[string]any {
		var detail map[string]any
		wait.For(t, 10*time.Second, "the audit.export event of "+actor, func() bool {
			err := obs.QueryRow(ctx, `SELECT detail FROM audit_event WHERE action = 'audit.export' AND actor = $1 AND id > $2 ORDER BY id LIMIT 1`, actor, after).Scan(&detail)
			return err == nil
		})
		return detail
	}
	lastExport := func(actor string) map[string]any { return exportAfter(actor, 0) }

	// The time bound before any row: the export's read waits on a lock.
	tx, err := obs.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE audit_event IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	answer := make(chan *response, 1)
	go func() { answer <- call(t, http.MethodGet, base+"/api/audit/export", "alice-token", nil) }()
	// The export's read stops at its bound; then its audit.export event
	// waits on the same lock, until the test lets it go.
	wait.For(t, 10*time.Second, "the audit.export event waiting on the lock", func() bool {
		// This database's sessions only: other tests on a shared server
		// insert audit events too.
		return count(obs, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE '%INSERT INTO audit_event%'`) > 0
	})
	_ = tx.Rollback(ctx)
	r := <-answer
	r.problemOf(t, http.StatusServiceUnavailable, "heavy-request-timed-out")
	want := map[string]any{"rows": float64(0), "partial": true, "bound": "TIME", "limit": "1s"}
	if got := lastExport("alice"); !cmp.Equal(got, want) {
		t.Errorf("audit.export of a 503: %v, want %v", got, want)
	}

	// Mid-stream: a client that reads slowly keeps the export running
	// while the test ends it, by terminating its backend or by leaving.
	// The backend is terminated only while it waits to send rows
	// (ClientWrite): one that has sent all it will send into the socket
	// buffers (the kernel grows them to several MB per socket) is past the
	// middle of its stream, and the try is made again. So that the export
	// cannot fit in the buffers, its first rows (the oldest) are made wide:
	// 40,000 rows of 1 kB, some 40 MB, ahead of the seeded 100-byte rows.
	if _, err := obs.Exec(ctx, `INSERT INTO audit_event (occurred_at, actor, action, target)
		SELECT timestamptz '2000-01-01 00:00:00+00' + interval '1 millisecond' * g, 'dave', 'wide.row', repeat('w', 1000)
		FROM generate_series(1, 40000) AS g`); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		actor, token, reason string
		end                  func(cancel func()) bool // false: not mid-stream, try again
	}{
		{"bob", "bob-token", "database-unavailable", func(func()) bool {
			// Only this test's database: the server may be shared with
			// other tests running the same export.
			ended := false
			deadline := time.Now().Add(3 * time.Second)
			for !ended && time.Now().Before(deadline) {
				var terminated int
				if err := obs.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND query LIKE '%FROM audit_event%ORDER BY occurred_at%'
					AND pid <> pg_backend_pid() AND state <> 'idle' AND wait_event = 'ClientWrite'`).Scan(&terminated); err != nil {
					t.Error(err)
					return true
				}
				if terminated > 1 {
					t.Errorf("terminated %d backends running the export, want 1", terminated)
				}
				ended = terminated > 0
				if !ended {
					time.Sleep(20 * time.Millisecond)
				}
			}
			return ended
		}},
		{"carol", "carol-token", "client-gone", func(cancel func()) bool { cancel(); return true }},
	} {
		for attempt := 1; ; attempt++ {
			before := lastEvent()
			reqCtx, cancel := context.WithCancel(ctx)
			req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, unbounded+"/api/audit/export", nil)
			req.Header.Set("Authorization", "Bearer "+tc.token)
			resp, err := smallBufferClient().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := resp.Body.Read(make([]byte, 512)); err != nil {
				t.Fatal(err)
			}
			midStream := tc.end(cancel)
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			cancel()
			got := exportAfter(tc.actor, before)
			if !midStream {
				if attempt == 3 {
					t.Fatalf("%s: the export's backend never waited to send rows in 3 tries (last: %v)", tc.reason, got)
				}
				continue
			}
			if got["partial"] != true || got["reason"] != tc.reason || got["bound"] != nil {
				t.Errorf("audit.export of an export that ended with %s: %v", tc.reason, got)
			}
			if rows, _ := got["rows"].(float64); rows <= 0 || rows >= 100000 {
				t.Errorf("audit.export of an export that ended with %s: rows %v", tc.reason, got["rows"])
			}
			break
		}
	}
}

// TestLimitsWithoutReadReplica: without -read-replica-url the operator
// view says readReplicaHealthy null — present, never left out — and the
// history reads do not claim the replica served them.
// (TestFaultReadReplica covers true and false with a replica.)
func TestLimitsWithoutReadReplica(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1)
	r := call(t, http.MethodGet, procs[0].URL+"/api/limits", "alice-token", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("/api/limits: %d %s", r.Status, r.Body)
	}
	m := r.json(t)
	if h, ok := m["readReplicaHealthy"]; !ok || h != nil {
		t.Errorf("readReplicaHealthy without a read replica: %v (present %v), want null", h, ok)
	}
	if h := call(t, http.MethodGet, procs[0].URL+"/api/events?size=1", "alice-token", nil).json(t)["mayLag"]; h != false {
		t.Errorf("mayLag without a read replica: %v", h)
	}
}
