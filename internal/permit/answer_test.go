package permit_test

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/internal/permit"
)

// hogs keeps every core busy with a busy loop until the test ends.
func hogs(t *testing.T) {
	var stopped atomic.Bool
	var wg sync.WaitGroup
	for range runtime.NumCPU() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// A busy loop: spinning is the point (a hog per core).
			for !stopped.Load() {
			}
		}()
	}
	t.Cleanup(func() {
		stopped.Store(true)
		wg.Wait()
	})
}

// lockScopes has a session of pool lock the rows of the slots of scopes
// (kind request_in_flight) until the returned function commits.
func lockScopes(t *testing.T, pool *pgxpool.Pool, scopes []string) (unlock func()) {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	rows, _ := tx.Query(ctx, `SELECT slot FROM pglimit.slot WHERE kind = 'request_in_flight' AND scope = ANY($1)
		AND expires_at > now() FOR UPDATE`, scopes)
	locked, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		t.Fatal(err)
	}
	if len(locked) != len(scopes) {
		t.Fatalf("locked %d rows of %d scopes", len(locked), len(scopes))
	}
	var once sync.Once
	unlock = func() {
		once.Do(func() {
			if err := tx.Commit(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	t.Cleanup(unlock)
	return unlock
}

// TestReleaseBeforeAnswerWaitsForItsBatch: ReleaseBeforeAnswer, a
// Handler's release before its answer, returns only once the round trip
// that carries its release has landed, a batch shared with other releases
// included, for as long as the database answers within the Timeout (30 s
// here); beside a busy loop per core. Eight callers of one replica (a
// pool) each hold a slot of its own scope (cap 1); another session holds
// the slots' rows locked, as a slow database would. Two releases go out
// alone (one on its caller's goroutine, one on a flusher) and wait for
// their rows; the six that follow queue behind them and, once the first
// two have landed, travel together in one statement (SlotRelease, which
// an observer of pg_stat_activity sees running), whose rows stay locked
// for 1.5 s after they were released (longer than the fixed second an
// answer used to wait). Each caller, the moment ReleaseBeforeAnswer
// returns, finds its slot's row released (an observer pool of its own
// reads it) and claims its scope at once on another replica: granted,
// every time.
func TestReleaseBeforeAnswerWaitsForItsBatch(t *testing.T) {
	t.Parallel()
	hogs(t)
	const (
		callers = 8
		alone   = 2 // releases in flight on their own: the Leaser's most round trips at once
		hold    = 1500 * time.Millisecond
	)
	pools, url := replicas(t, 2, 4)
	staller := pgtest.Pool(t, url, 2)
	observer := pgtest.Pool(t, url, 2)
	ctx := context.Background()
	mine := permit.New(pools[0], permit.Options{Kind: permit.RequestInFlight, Replica: "r0", Timeout: 30 * time.Second})
	next := permit.New(pools[1], permit.Options{Kind: permit.RequestInFlight, Replica: "r1", Timeout: 30 * time.Second})
	t.Cleanup(func() {
		_ = mine.Flush(ctx)
		_ = next.Flush(ctx)
	})
	claims := make([]permit.Claim, callers)
	leases := make([]*permit.Lease, callers)
	scopes := make([]string, callers)
	for i := range claims {
		scopes[i] = fmt.Sprintf("token:caller%d", i)
		claims[i] = permit.Claim{Scopes: []permit.Scope{{Key: scopes[i], Cap: 1}}, Holder: "caller", Endpoint: "GET /", Lease: time.Hour}
		var err error
		if leases[i], err = mine.Claim(ctx, claims[i]); err != nil {
			t.Fatal(err)
		}
	}
	unlockFirst := lockScopes(t, staller, scopes[:alone])
	unlockBatch := lockScopes(t, staller, scopes[alone:])

	type outcome struct {
		err      error
		live     int       // the caller's live rows when its release returned
		returned time.Time // when it returned
		again    error     // its claim on the other replica, right after
	}
	outcomes := make([]outcome, callers)
	var wg sync.WaitGroup
	release := func(i int) {
		defer wg.Done()
		o := &outcomes[i]
		o.err = leases[i].ReleaseBeforeAnswer(ctx)
		o.returned = time.Now()
		if err := observer.QueryRow(ctx, `SELECT count(*) FROM pglimit.slot WHERE kind = 'request_in_flight' AND scope = $1
			AND expires_at > now()`, scopes[i]).Scan(&o.live); err != nil {
			o.live = -1
		}
		var lease *permit.Lease
		if lease, o.again = next.Claim(ctx, claims[i]); o.again == nil {
			_ = lease.Release(ctx)
		}
	}
	running := func(marker string) int {
		texts, err := activity.Running(ctx, observer, marker)
		if err != nil {
			t.Fatalf("observer of pg_stat_activity: %v", err)
		}
		return len(texts)
	}
	for i := range alone {
		wg.Add(1)
		go release(i)
		wait.For(t, time.Minute, fmt.Sprintf("%d releases on their own waiting for their rows", i+1), func() bool {
			return running("-- name: SlotReleaseOne :exec") == i+1
		})
	}
	for i := alone; i < callers; i++ {
		wg.Add(1)
		go release(i)
	}
	sent := time.Now()
	wait.For(t, time.Minute, "the other releases queued behind them", func() bool { return permit.Queued(mine) == callers-alone })
	unlockFirst()
	wait.For(t, time.Minute, "the queued releases sent together, waiting for their rows", func() bool {
		return running("-- name: SlotRelease :execrows") == 1
	})
	time.Sleep(time.Until(sent.Add(hold)))
	unlocked := time.Now()
	unlockBatch()
	wg.Wait()

	for i, o := range outcomes {
		switch {
		case o.err != nil:
			t.Errorf("caller %d: release: %v", i, o.err)
		case o.live != 0:
			t.Errorf("caller %d: %d live rows (-1: unread) when its release returned", i, o.live)
		case o.again != nil:
			t.Errorf("caller %d: its next claim, on another replica, right after its release returned: %v", i, o.again)
		case i >= alone && o.returned.Before(unlocked):
			t.Errorf("caller %d: its release returned %v before its batch could land", i, unlocked.Sub(o.returned))
		}
	}
	t.Logf("%d releases (%d alone, %d in one batch) beside %d busy loops; the batch's rows held %v after its releases were sent",
		callers, alone, callers-alone, runtime.NumCPU(), unlocked.Sub(sent).Round(time.Millisecond))
}
