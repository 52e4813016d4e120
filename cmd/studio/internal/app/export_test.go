package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestExportClientGoneBeforeAnyRowIsAudited: a client that leaves while
// its export waits for its first row (the test holds a lock on audit_event)
// still leaves the export's audit.export event: 0 rows, partial, reason
// client-gone. (TestExportMarks and TestExportFailuresAreAudited cover the
// other paths black-box.)
func TestExportClientGoneBeforeAnyRowIsAudited(t *testing.T) {
	t.Parallel()
	a, dbURL := testApp(t)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	obs := pgtest.Pool(t, dbURL, 2)
	ctx := context.Background()
	// waiting counts this database's statements like query that wait on a
	// lock.
	waiting := func(query string) (n int) {
		if err := obs.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock' AND query LIKE $1`, query).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	until := func(what string, cond func() bool) {
		t.Helper()
		for start := time.Now(); !cond(); time.Sleep(20 * time.Millisecond) {
			if time.Since(start) > time.Minute {
				t.Fatalf("%s: not within a minute", what)
			}
		}
	}
	tx, err := obs.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE audit_event IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(reqCtx, http.MethodGet, srv.URL+"/api/audit/export", nil)
		req.Header.Set("Authorization", "Bearer carol-token")
		resp, err := srv.Client().Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	until("the export waiting for its first row", func() bool { return waiting("%FROM audit_event%") > 0 })
	cancel()
	<-done
	// The event is written after the export ended: it waits on the lock.
	until("the audit.export event waiting on the lock", func() bool { return waiting("%INSERT INTO audit_event%") > 0 })
	_ = tx.Rollback(ctx)
	var rows int
	var partial bool
	var reason string
	until("the audit.export event", func() bool {
		return obs.QueryRow(ctx, `SELECT (detail->>'rows')::int, (detail->>'partial')::bool, coalesce(detail->>'reason', '')
			FROM audit_event WHERE action = 'audit.export' AND actor = 'carol'`).Scan(&rows, &partial, &reason) == nil
	})
	if rows != 0 || !partial || reason != "client-gone" {
		t.Errorf("audit.export of an export whose client left before any row: rows %d partial %v reason %q, want 0 true client-gone", rows, partial, reason)
	}
}
