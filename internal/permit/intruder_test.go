package permit_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/permit"
)

// TestNoClaimWaitsOnAnotherRolesLock: a database user of the host's that
// is not pglimit's owner (no grant on the schema pglimit, as the
// reference service's console role) holds, for the whole test, the
// advisory locks claims of the installation's and the users' scopes once
// took turns on, and cannot lock (nor read) the rows they take turns on
// now. Meanwhile four pools (replicas) claim heavy permits in two scopes
// (a user's and the installation's) in bursts, round after round, so
// that claims travel together and lose races, and are judged under the
// scope lock: every round grants exactly what the caps allow, with no
// error (with the advisory locks, every claim judged under them waited
// until its Timeout and failed as unavailable), and the lock rows were
// taken.
func TestNoClaimWaitsOnAnotherRolesLock(t *testing.T) {
	t.Parallel()
	url, intruderURL := pgtest.WithIntruder(t)
	ctx := context.Background()
	intruder := pgtest.Pool(t, intruderURL, 2)
	conn, err := intruder.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	const claimers, userCap, installationCap = 16, 2, 6
	users := make([]string, claimers/2)
	for i := range users {
		users[i] = fmt.Sprintf("u%d", i)
	}
	// The old scope lock's keys: pg_advisory_xact_lock(1196, hashtext(kind || ':' || scope)).
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(1196, hashtext('heavy_permit:' || s))
		FROM unnest($1::text[]) AS s`, append([]string{"installation"}, userScopes(users)...)); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`SELECT FROM pglimit.slot_lock FOR NO KEY UPDATE`,
		`SELECT FROM pglimit.slot_lock FOR KEY SHARE`,
		`SELECT FROM pglimit.slot FOR KEY SHARE`,
		`LOCK TABLE pglimit.slot_lock IN ACCESS SHARE MODE`,
		`INSERT INTO pglimit.slot_lock VALUES (0) ON CONFLICT DO NOTHING`,
	} {
		tx, err := conn.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		_, err = tx.Exec(ctx, stmt)
		_ = tx.Rollback(ctx)
		var pg *pgconn.PgError
		if !errors.As(err, &pg) || pg.Code != "42501" {
			t.Fatalf("%s as a role with no grant: %v, want permission denied (42501)", stmt, err)
		}
	}

	pools := make([]*pgxpool.Pool, 4)
	for i := range pools {
		pools[i] = pgtest.Pool(t, url, 4)
	}
	ls := leasers(t, pools, permit.HeavyPermit)
	rounds := 40
	if testing.Short() {
		rounds = 15
	}
	for round := range rounds {
		var (
			start   = make(chan struct{})
			wg      sync.WaitGroup
			mu      sync.Mutex
			granted []*permit.Lease
			perUser = map[string]int{}
			errs    []error
		)
		for c := range claimers {
			user := users[c%len(users)]
			wg.Go(func() {
				<-start
				lease, err := ls[c%len(ls)].Claim(ctx, permit.Claim{
					Scopes: []permit.Scope{{Key: "user:e:" + user, Cap: userCap}, {Key: "installation", Cap: installationCap}},
					Holder: user, Endpoint: "e", Lease: time.Minute,
				})
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					granted = append(granted, lease)
					perUser[user]++
				case !errors.Is(err, permit.ErrRefused):
					errs = append(errs, err)
				}
			})
		}
		close(start)
		wg.Wait()
		if len(errs) > 0 {
			t.Fatalf("round %d: %d claims failed, the first: %v", round, len(errs), errs[0])
		}
		if len(granted) != installationCap {
			t.Fatalf("round %d: granted %d, want exactly the installation's %d", round, len(granted), installationCap)
		}
		for u, n := range perUser {
			if n > userCap {
				t.Fatalf("round %d: %s holds %d slots of a cap of %d", round, u, n, userCap)
			}
		}
		for _, l := range granted {
			if err := l.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		flushAll(t, ls)
	}
	if a := pgtest.Activity(t, url, "slot_lock", pools...); a.Writes+a.IndexScans == 0 {
		t.Fatal("no claim was judged under the scope lock: the test proves nothing")
	}
}

func userScopes(users []string) []string {
	out := make([]string, len(users))
	for i, u := range users {
		out[i] = "user:e:" + u
	}
	return out
}
