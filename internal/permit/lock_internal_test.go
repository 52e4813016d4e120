package permit

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/vocab"
)

// TestStalledTurnFailsAsUnavailable: when a claim judged under the scope
// lock cannot have its turn (here a transaction of pglimit's own role
// holds the installation's lock row; no other role can), it gives up at
// its lock_timeout, half the Leaser's Timeout, with SQLSTATE 55P03, which
// pglimit.Classify tells as unavailable (a 503 with Retry-After), not at
// the Timeout itself, and takes nothing; once the row is free, the next
// claim is granted.
func TestStalledTurnFailsAsUnavailable(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.URL(t), 4)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `INSERT INTO pglimit.slot_lock VALUES (hashtext('heavy_permit:installation') & 4095)
		ON CONFLICT (bucket) DO UPDATE SET bucket = excluded.bucket WHERE false`); err != nil {
		t.Fatal(err)
	}
	l := New(pool, Options{Kind: HeavyPermit, Replica: "r", Timeout: 4 * time.Second})
	c := Claim{Scopes: []Scope{{Key: "user:e:ann", Cap: 1}, {Key: "installation", Cap: 4}},
		Holder: "ann", Endpoint: "e", Lease: time.Minute}
	l.mu.Lock()
	l.contend(stored(&c)) // its scopes lost a race lately: it takes the lock first
	l.mu.Unlock()
	_, err = l.Claim(ctx, c)
	var pg *pgconn.PgError
	if !errors.As(err, &pg) || pg.Code != "55P03" || vocab.Classify(err) != vocab.ClassUnavailable {
		t.Fatalf("claim whose turn never came: %v (class %s), want lock_timeout's 55P03, unavailable", err, vocab.Classify(err))
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.heavy_permit`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("a claim that failed holds %d slots", n)
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	lease, err := l.Claim(ctx, c)
	if err != nil {
		t.Fatalf("claim after the lock row was freed: %v", err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
}
