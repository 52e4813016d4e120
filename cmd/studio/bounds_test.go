package main_test

// Tests of the heavy endpoints' bounds (issue 11, sections 4 and 5): a
// bound that is reached stops the work in the database, at once, and the
// answer says which bound it was.

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
)

// statsObserver is a connection to the test server that sees every
// session's statement in pg_stat_activity (a superuser, or a member of
// pg_read_all_stats). An observer that would be blind to the service's
// sessions fails the test instead of seeing nothing.
func statsObserver(t *testing.T) *pgxpool.Pool {
	t.Helper()
	obs := pgtest.Pool(t, pgtest.ServerURL(t), 2)
	var sees bool
	if err := obs.QueryRow(context.Background(), `SELECT rolsuper OR pg_has_role(current_user, 'pg_read_all_stats', 'MEMBER')
		FROM pg_roles WHERE rolname = current_user`).Scan(&sees); err != nil {
		t.Fatal(err)
	}
	if !sees {
		t.Fatal("the observer's role can neither see other roles' statements (superuser or pg_read_all_stats) nor be trusted to count them; run the tests as a superuser or grant pg_read_all_stats")
	}
	return obs
}

// statementsLike counts the sessions other than the observer's whose
// current or last statement holds marker and that still run it or hold
// its transaction open.
func statementsLike(t *testing.T, obs *pgxpool.Pool, marker string) int {
	t.Helper()
	var n int
	if err := obs.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE query LIKE '%'||$1||'%' AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'`, marker).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestConsoleCapsStopTheStatement runs console statements that would
// produce rows until the time bound (30 s): a cross join of the audit
// history, stopped by the row cap, and wide rows, stopped by the response
// size cap. Each answers 200 with bound ROWS well inside the time bound;
// right after the answer pg_stat_activity no longer shows the statement and
// no permit is held. Before the fix each took the whole 30 s, the database
// producing rows nobody read (pgx's Rows.Close reads a result to its end).
func TestConsoleCapsStopTheStatement(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-sql-console-time", "30s", "-sql-console-rows", "1000")
	obs := statsObserver(t)
	limits := pgtest.Pool(t, dbURL, 1)
	for _, tc := range []struct {
		name, marker, sql string
		rows              func(int) bool
	}{
		{"row cap", "probe-row-cap", `SELECT a.id, b.id, 'probe-row-cap' FROM audit_event a CROSS JOIN audit_event b`,
			func(n int) bool { return n == 1000 }},
		{"size cap", "probe-size-cap", `SELECT repeat('x', 60000), 'probe-size-cap' FROM audit_event a CROSS JOIN audit_event b`,
			func(n int) bool { return n > 0 && n < 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := call(t, http.MethodPost, procs[0].URL+"/api/sql", "alice-token", console(tc.sql))
			took := time.Since(start)
			if r.Status != http.StatusOK {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			m := r.json(t)
			rows, _ := m["rows"].([]any)
			if m["bound"] != "ROWS" || !tc.rows(len(rows)) {
				t.Fatalf("bound %v with %d rows", m["bound"], len(rows))
			}
			// A behavioural bound, not a speed claim: the answer comes when
			// the cap is reached, not at the 30 s time bound.
			if took > 5*time.Second {
				t.Errorf("answered after %v; the time bound is 30s and the cap was reached at once", took)
			}
			gone := waitFor(t, 5*time.Second, "the statement gone from pg_stat_activity and the permits released", func() bool {
				return statementsLike(t, obs, tc.marker) == 0 &&
					count(limits, `SELECT count(*) FROM pglimit.heavy_permit`) == 0
			})
			t.Logf("answered in %v with %d rows; statement and permits gone %v after the answer", took.Round(time.Millisecond), len(rows), gone.Round(time.Millisecond))
		})
	}
}
