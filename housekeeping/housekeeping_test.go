package housekeeping_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/harness/pgtest"
	"github.com/pglimit/pglimit/housekeeping"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// TestSweep: one sweep deletes the lapsed rows and reports every table;
// while another replica holds the housekeeping lock it leaves the sweep to
// it and returns nil. (The sweep itself is tested in internal/housekeep.)
func TestSweep(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `INSERT INTO pglimit.login_attempt (key, failures, first_at, last_at, expires_at)
		VALUES ('lapsed', 3, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 minute'),
		       ('live', 3, now(), now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	got, err := housekeeping.Sweep(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"heavy_permit": 0, "request_in_flight": 0, "upload_window": 0, "login_attempt": 1,
		"replica": 0, "api_request_window": 0, "refusal_minute": 0, "quota_usage": 0, "quota_ledger": 0, "ban": 0}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("deleted (-want +got):\n%s", diff)
	}

	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(1199, 1)`); err != nil {
		t.Fatal(err)
	}
	if got, err := housekeeping.Sweep(ctx, pool); err != nil || got != nil {
		t.Fatalf("Sweep while another replica sweeps = %v, %v; want nil, nil", got, err)
	}
}
