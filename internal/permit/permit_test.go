package permit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/permit"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// replicas opens n pools of size conns on one fresh database: stand-ins for
// n replicas of a service.
func replicas(t *testing.T, n int, conns int32) ([]*pgxpool.Pool, string) {
	t.Helper()
	url := pgtest.URL(t)
	pools := make([]*pgxpool.Pool, n)
	for i := range pools {
		pools[i] = pgtest.Pool(t, url, conns)
	}
	return pools, url
}

func leasers(t *testing.T, pools []*pgxpool.Pool, table permit.Kind) []*permit.Leaser {
	t.Helper()
	return leasersVia(t, pools, table, false)
}

// leasersVia is leasers that claim, when onShard, with the function a
// Citus cluster runs on a scope's shard.
func leasersVia(t *testing.T, pools []*pgxpool.Pool, table permit.Kind, onShard bool) []*permit.Leaser {
	t.Helper()
	out := make([]*permit.Leaser, len(pools))
	for i, p := range pools {
		l := permit.New(p, permit.Options{Kind: table, Replica: fmt.Sprintf("r%d", i)})
		if onShard {
			permit.OnShard(l)
		}
		out[i] = l
		// Registered after the pool's own cleanup, so it runs first: no
		// release is still on its way when the pool closes.
		t.Cleanup(func() { _ = l.Flush(context.Background()) })
	}
	return out
}

// flushAll waits for the releases of every leaser.
func flushAll(t *testing.T, ls []*permit.Leaser) {
	t.Helper()
	for _, l := range ls {
		if err := l.Flush(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBurstGrantsExactlyCap fires 16 simultaneous claims on one scope from
// four pools, round after round, and checks that every round grants exactly
// min(cap, 16): never more (an over-grant) and never fewer while slots are
// free (a false refusal, which the naive statement without the scope lock
// gives about a third of the time).
func TestBurstGrantsExactlyCap(t *testing.T) {
	t.Parallel()
	for _, table := range []permit.Kind{permit.HeavyPermit, permit.RequestInFlight, permit.UploadWindow} {
		for _, capacity := range []int{4, 16} {
			for _, onShard := range []bool{false, true} {
				t.Run(fmt.Sprintf("%s/cap%d%s", table, capacity, map[bool]string{true: "/shard function"}[onShard]), func(t *testing.T) {
					t.Parallel()
					pools, _ := replicas(t, 4, 4)
					ls := leasersVia(t, pools, table, onShard)
					const claimers = 16
					rounds := 150
					if testing.Short() {
						rounds = 30
					}
					ctx := context.Background()
					for round := 0; round < rounds; round++ {
						var (
							start   = make(chan struct{})
							wg      sync.WaitGroup
							mu      sync.Mutex
							granted []*permit.Lease
							refused int
							errs    []error
						)
						for c := 0; c < claimers; c++ {
							wg.Add(1)
							go func() {
								defer wg.Done()
								<-start
								lease, err := ls[c%len(ls)].Claim(ctx, permit.Claim{
									Scopes: []permit.Scope{{Key: "burst", Cap: capacity}},
									Holder: fmt.Sprintf("c%d", c), Endpoint: "test", Lease: time.Minute,
								})
								mu.Lock()
								defer mu.Unlock()
								switch {
								case err == nil:
									granted = append(granted, lease)
								case errors.Is(err, permit.ErrRefused):
									refused++
								default:
									errs = append(errs, err)
								}
							}()
						}
						close(start)
						wg.Wait()
						if len(errs) > 0 {
							t.Fatalf("round %d: %v", round, errs[0])
						}
						if want := min(capacity, claimers); len(granted) != want {
							t.Fatalf("round %d: granted %d, refused %d; want exactly %d granted", round, len(granted), refused, want)
						}
						for _, l := range granted {
							if err := l.Release(ctx); err != nil {
								t.Fatal(err)
							}
						}
						// The next round's claimers are other replicas too:
						// every release must have landed.
						flushAll(t, ls)
					}
				})
			}
		}
	}
}

// TestClaimIsAllOrNothing claims a user scope and an installation scope
// together: when the installation is full the user's slot is not taken
// either, and the refusal names the installation scope.
func TestClaimIsAllOrNothing(t *testing.T) {
	t.Parallel()
	// On a scope's shard the two scopes are claimed one after the other,
	// in key order, in one transaction: "~installation" sorts after the
	// user's scope, so the user's slot is taken and must be rolled back.
	for _, tc := range []struct {
		name, installation string
		onShard            bool
	}{
		{"statements", "installation", false},
		{"shard function", "installation", true},
		{"shard function, installation last", "~installation", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			claimIsAllOrNothing(t, tc.installation, tc.onShard)
		})
	}
}

func claimIsAllOrNothing(t *testing.T, installation string, onShard bool) {
	pools, _ := replicas(t, 2, 2)
	ls := leasersVia(t, pools, permit.HeavyPermit, onShard)
	ctx := context.Background()
	inst := permit.Scope{Key: installation, Cap: 1}
	held, err := ls[0].Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "user:x:bob", Cap: 2}, inst}, Holder: "bob", Endpoint: "x", Lease: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	_, err = ls[1].Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "user:x:alice", Cap: 2}, inst}, Holder: "alice", Endpoint: "x", Lease: time.Minute})
	var refused *permit.RefusedError
	if !errors.As(err, &refused) {
		t.Fatalf("claim with the installation full: %v, want a *RefusedError", err)
	}
	if diff := cmp.Diff(&permit.RefusedError{Scope: inst, Live: 1}, refused, cmpopts.IgnoreFields(permit.RefusedError{}, "FirstLapse")); diff != "" {
		t.Errorf("refusal (-want +got):\n%s", diff)
	}
	if refused.FirstLapse <= 50*time.Second || refused.FirstLapse > time.Minute {
		t.Errorf("FirstLapse = %v, want about a minute", refused.FirstLapse)
	}
	var aliceRows int
	if err := pools[0].QueryRow(ctx, `SELECT count(*) FROM pglimit.heavy_permit WHERE scope = 'user:x:alice'`).Scan(&aliceRows); err != nil {
		t.Fatal(err)
	}
	if aliceRows != 0 {
		t.Fatalf("a refused claim left %d rows in the user's scope", aliceRows)
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	flushAll(t, ls)
	if _, err := ls[1].Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "user:x:alice", Cap: 2}, inst}, Holder: "alice", Endpoint: "x", Lease: time.Minute}); err != nil {
		t.Fatalf("claim after release: %v", err)
	}
}

// TestVanishedHolderLapses closes a pool without releasing its slot (a
// replica that died) and checks that the slot is refused to others until
// its lease ends on the database clock, and granted right after.
func TestVanishedHolderLapses(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	dying := pgtest.Pool(t, url, 1)
	alive := pgtest.Pool(t, url, 1)
	ctx := context.Background()
	dl := permit.New(dying, permit.Options{Replica: "dying"})
	al := permit.New(alive, permit.Options{Replica: "alive"})
	scope := []permit.Scope{{Key: "user:export:carol", Cap: 1}}
	const lease = 1500 * time.Millisecond
	if _, err := dl.Claim(ctx, permit.Claim{Scopes: scope, Holder: "carol", Endpoint: "export", Lease: lease}); err != nil {
		t.Fatal(err)
	}
	claimedAt := time.Now()
	dying.Close()

	if _, err := al.Claim(ctx, permit.Claim{Scopes: scope, Holder: "carol", Endpoint: "export", Lease: lease}); !errors.Is(err, permit.ErrRefused) {
		t.Fatalf("claim while the dead holder's lease runs: %v, want refused", err)
	}
	for {
		_, err := al.Claim(ctx, permit.Claim{Scopes: scope, Holder: "carol", Endpoint: "export", Lease: lease})
		if err == nil {
			break
		}
		if !errors.Is(err, permit.ErrRefused) {
			t.Fatal(err)
		}
		if time.Since(claimedAt) > lease+2*time.Second {
			t.Fatalf("slot still held %v after a lease of %v", time.Since(claimedAt), lease)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if waited := time.Since(claimedAt); waited < lease-100*time.Millisecond {
		t.Fatalf("slot granted again after %v, before the lease of %v ended", waited, lease)
	}
}

// TestReleaseNeverFreesAnotherHoldersSlot lets a lease lapse, has another
// holder claim the slot, and checks that the first holder's late release
// leaves the new holder's row alone.
func TestReleaseNeverFreesAnotherHoldersSlot(t *testing.T) {
	t.Parallel()
	pools, _ := replicas(t, 1, 2)
	l := leasers(t, pools, permit.RequestInFlight)[0]
	ctx := context.Background()
	scope := []permit.Scope{{Key: "token:1", Cap: 1}}
	first, err := l.Claim(ctx, permit.Claim{Scopes: scope, Holder: "a", Endpoint: "GET /", Lease: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	second, err := l.Claim(ctx, permit.Claim{Scopes: scope, Holder: "b", Endpoint: "GET /", Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim of a lapsed slot: %v", err)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, permit.Claim{Scopes: scope, Holder: "c", Endpoint: "GET /", Lease: time.Minute}); !errors.Is(err, permit.ErrRefused) {
		t.Fatalf("after a stale release the slot was free again: %v", err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := second.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
}

// TestLoweredCapIsHonoured holds three slots under cap 4, then claims with
// cap 2: refused, although slot 1 or 2 may be free.
func TestLoweredCapIsHonoured(t *testing.T) {
	t.Parallel()
	pools, _ := replicas(t, 1, 2)
	l := leasers(t, pools, permit.HeavyPermit)[0]
	ctx := context.Background()
	var leases []*permit.Lease
	for i := 0; i < 3; i++ {
		lease, err := l.Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "s", Cap: 4}}, Lease: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	if err := leases[0].Release(ctx); err != nil { // slot 1 is free again
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "s", Cap: 2}}, Lease: time.Minute}); !errors.Is(err, permit.ErrRefused) {
		t.Fatalf("claim under a lowered cap with 2 live slots: %v, want refused", err)
	}
}

// TestScopeKeyIsInjective: parts containing the separator never collide.
func TestScopeKeyIsInjective(t *testing.T) {
	t.Parallel()
	pairs := [][2][]string{
		{{"a:b", "c"}, {"a", "b:c"}},
		{{`a\`, "b"}, {`a\:b`}},
		{{"user", "x", ""}, {"user", "x:"}},
	}
	for _, p := range pairs {
		if a, b := permit.ScopeKey(p[0]...), permit.ScopeKey(p[1]...); a == b {
			t.Errorf("ScopeKey(%q) == ScopeKey(%q) == %q", p[0], p[1], a)
		}
	}
}

// TestReleaseOnAFrozenDatabase freezes the database (SIGSTOP) while a
// slot is held: Release waits no longer than its ctx (ReleaseWithin's
// wait here) and the release goes on without it; Flush says the
// release has not landed while the database stays frozen, and once it
// answers again Flush sees the release to it and the slot is free to
// another replica.
func TestReleaseOnAFrozenDatabase(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	t.Cleanup(c.Thaw)
	ctx := context.Background()
	pool := pgtest.Pool(t, c.URL("postgres"), 2)
	other := pgtest.Pool(t, c.URL("postgres"), 2)
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	l := permit.New(pool, permit.Options{Kind: permit.RequestInFlight, Timeout: time.Minute})
	o := permit.New(other, permit.Options{Kind: permit.RequestInFlight})
	claim := permit.Claim{Scopes: []permit.Scope{{Key: "token:1", Cap: 1}}, Holder: "t", Endpoint: "GET /", Lease: time.Hour}
	lease, err := l.Claim(ctx, claim)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	released := make(chan error, 1)
	go func() { released <- lease.ReleaseWithin(ctx, 300*time.Millisecond) }()
	select {
	case err := <-released:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Release on a frozen database: %v, want its wait's deadline", err)
		}
	case <-time.After(20 * time.Second): // a release that ignores its ctx never returns here
		t.Fatal("Release waited past its ctx for a frozen database")
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := l.Flush(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Flush while the database is frozen: %v, want the deadline", err)
	}
	c.Thaw()
	if err := l.Flush(ctx); err != nil {
		t.Fatalf("Flush after the thaw: %v", err)
	}
	if _, err := o.Claim(ctx, claim); err != nil {
		t.Fatalf("another replica's claim after the flushed release: %v", err)
	}
}

// TestReleasedSlotIsFreeOnEveryReplica: at cap 1, a caller releases on one
// replica and at once claims on another, round after round, as a client
// whose requests a load balancer spreads does: once Release returned the
// slot is free everywhere, so no claim is ever refused (a release that
// returned before landing fails this).
func TestReleasedSlotIsFreeOnEveryReplica(t *testing.T) {
	t.Parallel()
	pools, _ := replicas(t, 3, 4)
	ls := leasers(t, pools, permit.RequestInFlight)
	ctx := context.Background()
	claim := permit.Claim{Scopes: []permit.Scope{{Key: "token:spread", Cap: 1}}, Holder: "t", Endpoint: "GET /", Lease: time.Minute}
	rounds := 300
	if testing.Short() {
		rounds = 100
	}
	for i := range rounds {
		l := ls[i%len(ls)]
		lease, err := l.Claim(ctx, claim)
		if err != nil {
			t.Fatalf("round %d on replica %d: %v (the previous round's release had returned)", i, i%len(ls), err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("round %d: release: %v", i, err)
		}
	}
}

// TestClaimAfterOwnReleaseIsNeverRefused: a caller that releases and then
// claims again on the same Leaser, at cap 1, is granted every time, even
// when it stopped waiting for its release (a ctx already ended, as a
// client gone or an answer that stopped waiting): the release goes on without
// it, and the claim may travel in another batch while the release is
// still in flight (the pause between them, up to a few round trips, lands
// claims in every phase of the release's round trip).
func TestClaimAfterOwnReleaseIsNeverRefused(t *testing.T) {
	t.Parallel()
	pools, _ := replicas(t, 1, 4)
	l := leasers(t, pools, permit.HeavyPermit)[0]
	ctx := context.Background()
	ended, cancel := context.WithCancel(ctx)
	cancel()
	claim := permit.Claim{Scopes: []permit.Scope{{Key: "user:e:ann", Cap: 1}, {Key: "installation", Cap: 1}}, Holder: "ann", Endpoint: "e", Lease: time.Minute}
	rounds := 400
	if testing.Short() {
		rounds = 150
	}
	for i := 0; i < rounds; i++ {
		lease, err := l.Claim(ctx, claim)
		if err != nil {
			t.Fatalf("claim %d after the previous one was released: %v", i, err)
		}
		if err := lease.Release(ended); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		time.Sleep(time.Duration(rand.IntN(400)) * time.Microsecond)
	}
}

// TestFlushLandsEveryRelease holds 150 slots on each of three replicas,
// releases them all at once without waiting for them (a ctx already
// ended: several batches' worth on their way), flushes each replica, and
// counts the live slots with an observer of its own: none is left, so a
// clean shutdown loses no release.
func TestFlushLandsEveryRelease(t *testing.T) {
	t.Parallel()
	pools, url := replicas(t, 3, 4)
	ls := leasers(t, pools, permit.RequestInFlight)
	ctx := context.Background()
	var leases []*permit.Lease
	for i := 0; i < 450; i++ {
		lease, err := ls[i%3].Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: fmt.Sprintf("token:%d", i), Cap: 1}}, Lease: time.Hour})
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, lease)
	}
	ended, cancel := context.WithCancel(ctx)
	cancel()
	for _, lease := range leases {
		if err := lease.Release(ended); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	}
	flushAll(t, ls)
	observer := pgtest.Pool(t, url, 1)
	var live int
	if err := observer.QueryRow(ctx, `SELECT count(*) FROM pglimit.request_in_flight`).Scan(&live); err != nil {
		t.Fatal(err)
	}
	if live != 0 {
		t.Fatalf("%d of %d slots live after every lease was released and flushed", live, len(leases))
	}
}
