package heavy_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// hogs keeps every core busy with a busy loop until the test ends: the
// machine a loaded CI runner is.
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

// TestSequentialClientNeverRefusedByItsOwnPermit: clients with a cap of 1
// (a heavy endpoint's, and an in-flight cap's around it, as cmd/studio
// nests them) each send request after request, each only once it has read
// the previous answer, round after round on the next of three replicas
// (three pools on one database), beside a busy loop per core. In two
// rounds of three, every request's release is slowed: its handler has
// another session lock its permit's row (the heavy one, or the in-flight
// one) for 1.5 s, longer than the fixed second an answer used to wait for
// its release, far within the limiters' Timeout (30 s): the database
// answers, slowly. All the clients' requests of a round reach one replica
// at once, so their releases share round trips (batches).
//
// Judged by an observer of its own (a separate pool reading pglimit.slot)
// the moment each answer has been read: the client's rows are already
// released; no request is ever refused (429); and a slowed request's
// answer took at least the 1.5 s its release was held (the answer waited
// for it). Before the answer waited for the release for as long as the
// database answers within the Timeout, the slowed answers went out after
// 1 s and the next request was refused by the client's own permit.
func TestSequentialClientNeverRefusedByItsOwnPermit(t *testing.T) {
	t.Parallel()
	const (
		clients  = 6
		rounds   = 12
		stall    = 1500 * time.Millisecond
		timeout  = 30 * time.Second
		replicas = 3
	)
	hogs(t)
	url := pgtest.URL(t)
	staller := pgtest.Pool(t, url, clients)
	observer := pgtest.Pool(t, url, 2)
	ctx := context.Background()

	var stalls sync.WaitGroup
	t.Cleanup(stalls.Wait) // after every request: no lock outlives the test
	// work answers 200 at once; with X-Stall it first has the staller lock
	// the live row of the user's slot of that kind (its heavy permit in
	// the user's scope, or its in-flight slot) for stall, so the release
	// that follows waits for it.
	work := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if kind := r.Header.Get("X-Stall"); kind != "" {
			user := r.Header.Get("X-User")
			if err := lockFor(ctx, staller, kind, user, stall, &stalls); err != nil {
				t.Errorf("%s: stalling the release of its %s: %v", user, kind, err)
				w.WriteHeader(http.StatusInternalServerError)
				return
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	urls := make([]string, replicas)
	for i := range urls {
		pool := pgtest.Pool(t, url, 4)
		name := fmt.Sprintf("r%d", i)
		hv, err := heavy.New(pool, heavy.Options{Name: "sql-console", Key: userHeader, Limit: 1, InstallationLimit: 64,
			Time: timeout, Timeout: timeout, Replica: name})
		if err != nil {
			t.Fatal(err)
		}
		fl, err := inflight.New(pool, inflight.Options{Key: userHeader, Limit: 1, Timeout: timeout, Replica: name})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(fl.Handler(hv.Handler(work)))
		t.Cleanup(func() {
			srv.Close()
			_ = hv.Flush(ctx)
			_ = fl.Flush(ctx)
		})
		urls[i] = srv.URL
	}
	batched, err := activity.Watch(ctx, url, "-- name: SlotRelease :execrows")
	if err != nil {
		t.Fatal(err)
	}

	var (
		ok, refused, early, slow atomic.Int64
		stalled                  = map[string]time.Duration{} // kind -> the shortest answer of a stalled request
		mu                       sync.Mutex
	)
	for round := range rounds {
		kind := []string{"heavy_permit", "request_in_flight", ""}[round%3]
		base := urls[round%replicas]
		var wg sync.WaitGroup
		for c := range clients {
			wg.Add(1)
			go func() {
				defer wg.Done()
				user := fmt.Sprintf("user%d", c)
				req, _ := http.NewRequest(http.MethodGet, base, nil)
				req.Header.Set("X-User", user)
				if kind != "" {
					req.Header.Set("X-Stall", kind)
				}
				start := time.Now()
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Errorf("round %d, %s: %v", round, user, err)
					return
				}
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				took := time.Since(start)
				// The answer has been read: the client's rows must be back.
				var live int
				if err := observer.QueryRow(ctx, `SELECT count(*) FROM pglimit.slot WHERE holder = $1 AND expires_at > now()`,
					user).Scan(&live); err != nil {
					t.Errorf("observer: %v", err)
					return
				}
				if live != 0 {
					early.Add(1)
					t.Errorf("round %d, %s: %d of its slots still live once its answer (%d, after %v) was read",
						round, user, live, resp.StatusCode, took.Round(time.Millisecond))
				}
				switch resp.StatusCode {
				case http.StatusOK:
					ok.Add(1)
				case http.StatusTooManyRequests:
					refused.Add(1)
					t.Errorf("round %d, %s: refused (429) though its previous answer had been read", round, user)
					return
				default:
					t.Errorf("round %d, %s: status %d", round, user, resp.StatusCode)
					return
				}
				if kind == "" {
					return
				}
				if took < stall {
					slow.Add(1)
					t.Errorf("round %d, %s: the answer came after %v, before its release could land (its row was held %v)",
						round, user, took.Round(time.Millisecond), stall)
				}
				mu.Lock()
				if d, seen := stalled[kind]; !seen || took < d {
					stalled[kind] = took
				}
				mu.Unlock()
			}()
		}
		wg.Wait()
	}
	peak, samples, err := batched.Stop()
	if err != nil {
		t.Fatalf("observer of pg_stat_activity: %v", err)
	}
	t.Logf("%d clients × %d sequential requests over %d replicas beside %d busy loops: %d answered 200, %d refused, "+
		"%d answers read before their release had landed, %d slowed answers sooner than their release; shortest answer "+
		"of a request whose heavy release was held %v: %v, in-flight release: %v; batched releases (several in one "+
		"statement) seen running at once: %d in %d samples",
		clients, rounds, replicas, runtime.NumCPU(), ok.Load(), refused.Load(), early.Load(), slow.Load(), stall,
		stalled["heavy_permit"].Round(time.Millisecond), stalled["request_in_flight"].Round(time.Millisecond), peak, samples)
	if want := int64(clients * rounds); ok.Load() != want {
		t.Errorf("%d of %d requests answered 200", ok.Load(), want)
	}
}

// lockFor has a session of pool lock the live row of user's slot of kind
// (outside the installation's scope) for d, and reports an error unless
// it locked exactly one. The lock ends on a goroutine counted in wg.
func lockFor(ctx context.Context, pool *pgxpool.Pool, kind, user string, d time.Duration, wg *sync.WaitGroup) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	rows, _ := tx.Query(ctx, `SELECT slot FROM pglimit.slot WHERE kind = $1 AND holder = $2 AND scope <> 'installation'
		AND expires_at > now() FOR UPDATE`, kind, user)
	locked, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err == nil && len(locked) != 1 {
		err = fmt.Errorf("locked %d rows, want its one", len(locked))
	}
	if err != nil {
		_ = tx.Rollback(ctx)
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(d)
		_ = tx.Commit(ctx)
	}()
	return nil
}
