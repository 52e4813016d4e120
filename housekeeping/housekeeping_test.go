package housekeeping_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/housekeeping"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// TestSweep: one sweep deletes the lapsed rows and reports every table
// (an access rule past its expiry included, the rules in force kept);
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
	// The allow and deny lists: a rule past its expiry goes; one that
	// lapses later and one that never lapses stay.
	if _, err := pool.Exec(ctx, `INSERT INTO pglimit.access_rule (list, match, created_at, expires_at)
		VALUES ('deny', '192.0.2.0/24', now() - interval '1 hour', now() - interval '1 second'),
		       ('allow', 'user:alice', now(), now() + interval '1 hour'),
		       ('deny', 'user:mallory', now(), NULL)`); err != nil {
		t.Fatal(err)
	}
	got, err := housekeeping.Sweep(ctx, pool)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{"heavy_permit": 0, "request_in_flight": 0, "upload_window": 0, "login_attempt": 1,
		"replica": 0, "api_request_window": 0, "refusal_minute": 0, "quota_usage": 0, "quota_ledger": 0, "ban": 0, "access_rule": 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("deleted (-want +got):\n%s", diff)
	}
	rows, err := pool.Query(ctx, `SELECT match FROM pglimit.access_rule ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	left, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"user:alice", "user:mallory"}, left); diff != "" {
		t.Errorf("access rules left (-want +got):\n%s", diff)
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
