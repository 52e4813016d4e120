package permit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestLostRaceTakesNothing: a claim in two scopes without the scope lock
// (SlotClaimTwo, a lone caller's heavy permit) picks the installation's
// free slot 1 while another transaction is taking it; once that one
// commits, the statement fails as a lost race and keeps the user's slot
// either (a statement that skipped the live holder instead would keep it,
// half a claim), and the Leaser judges the claim again under the scope
// lock: refused, the installation's one slot being held, with nothing
// taken.
func TestLostRaceTakesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.URL(t), 4)
	live := func(scope string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.heavy_permit WHERE scope = $1`, scope).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// take starts a transaction holding installation slot 1, uncommitted,
	// and returns its commit.
	take := func() func() {
		t.Helper()
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := tx.Exec(ctx, `INSERT INTO pglimit.slot (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
			VALUES ('heavy_permit', 'installation', 1, gen_random_uuid(), 'other', 'e', 'r', now(), now() + interval '1 hour')
			ON CONFLICT (kind, scope, slot) DO UPDATE SET lease_id = excluded.lease_id, expires_at = excluded.expires_at`); err != nil {
			t.Fatal(err)
		}
		return func() {
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		}
	}
	// waiting reports whether a claim statement waits for a lock.
	waiting := func() bool {
		var n int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%SlotClaimTwo%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n > 0
	}
	commitWhenWaiting := func(commit func()) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for !waiting() {
			if time.Now().After(deadline) {
				t.Fatal("the claim never waited for the other transaction's slot")
			}
			time.Sleep(5 * time.Millisecond)
		}
		commit()
	}

	// The statement itself.
	commit := take()
	failed := make(chan error, 1)
	go func() {
		_, err := db.New().SlotClaimTwo(ctx, pool, &db.SlotClaimTwoParams{Kind: string(HeavyPermit),
			Scope1: "user:e:ann", Cap1: 1, Scope2: "installation", Cap2: 1, LeaseID: uuid.NewString(),
			Holder: "ann", Endpoint: "e", Replica: "r", LeaseMs: 60_000})
		failed <- err
	}()
	commitWhenWaiting(commit)
	if err := <-failed; !lostRace(err) {
		t.Fatalf("SlotClaimTwo that lost the installation's slot: %v, want a lost race", err)
	}
	if n := live("user:e:ann"); n != 0 {
		t.Fatalf("a claim that lost the installation's slot kept %d slot(s) of the user's scope", n)
	}

	// Through a Leaser: judged again, and refused.
	if _, err := pool.Exec(ctx, `DELETE FROM pglimit.slot WHERE kind = 'heavy_permit'`); err != nil {
		t.Fatal(err)
	}
	l := New(pool, Options{Kind: HeavyPermit, Replica: "r"})
	commit = take()
	refused := make(chan error, 1)
	go func() {
		_, err := l.Claim(ctx, Claim{Scopes: []Scope{{Key: "user:e:bob", Cap: 1}, {Key: "installation", Cap: 1}},
			Holder: "bob", Endpoint: "e", Lease: time.Minute})
		refused <- err
	}()
	commitWhenWaiting(commit)
	var re *RefusedError
	if err := <-refused; !errors.As(err, &re) || re.Scope.Key != "installation" || re.Live != 1 {
		t.Fatalf("claim that lost the installation's slot: %v, want refused by the installation (1 live)", err)
	}
	if n := live("user:e:bob"); n != 0 {
		t.Fatalf("a refused claim kept %d slot(s) of the user's scope", n)
	}
}
