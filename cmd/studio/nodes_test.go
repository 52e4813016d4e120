package main_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
)

// TestNodeQueuesAndSharedRate reads a fake broker node's 450 queues
// through three replicas whose node rate is 6 per second for the
// installation: every answer lists the queues with their counts, and the
// node, counting what it receives from all three, never sees more than 6
// calls in a second once past the first second's burst. An unknown node is
// 404 and a node that does not answer is 502 node-unreachable.
func TestNodeQueuesAndSharedRate(t *testing.T) {
	t.Parallel()
	node, err := fakenode.New(fakenode.Options{Queues: 450})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(node)
	defer srv.Close()
	dead := httptest.NewServer(http.NotFoundHandler())
	deadURL := dead.URL
	dead.Close()
	procs, _ := studio(t, 3, "-node", "b1="+srv.URL, "-node", "gone="+deadURL, "-node-rate", "6", "-heartbeat", "200ms")

	r := call(t, http.MethodGet, procs[0].URL+"/api/nodes/b1/queues", "alice-token", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	var got struct {
		Queues []struct {
			Name          string `json:"name"`
			MessageCount  int64  `json:"messageCount"`
			ConsumerCount int64  `json:"consumerCount"`
		} `json:"queues"`
	}
	if err := jsonUnmarshal(r.Body, &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Queues) != 450 {
		t.Fatalf("%d queues, want 450", len(got.Queues))
	}
	for _, q := range got.Queues {
		var i int
		fmt.Sscanf(q.Name, "q%d", &i)
		if q.MessageCount != fakenode.MessageCount(i) || q.ConsumerCount != fakenode.ConsumerCount(i) {
			t.Fatalf("queue %s: %d messages, %d consumers", q.Name, q.MessageCount, q.ConsumerCount)
		}
	}
	if st := node.Stats(); st.Calls != 4 || st.MaxRequestsPerCall > 200 {
		t.Fatalf("450 queues took %d calls (want 1 search + 3 reads), largest %d reads", st.Calls, st.MaxRequestsPerCall)
	}
	// The service counts its broker calls in studio.broker.calls by kind
	// (REFERENCE-SERVICE.md); pglimit's node limiter counts the turns it
	// gave under its own name, one series without the broker's kinds.
	metrics := scrape(t, procs[0].URL)
	if got, want := sums(t, metrics, "studio_broker_calls_total", "kind"), map[string]int64{"search": 1, "read": 3}; !maps.Equal(got, want) {
		t.Errorf("studio_broker_calls_total by kind on the replica that listed the queues: %v, want %v", got, want)
	}
	if got, want := sums(t, metrics, "pglimit_nodelimit_calls_total", "kind"), map[string]int64{"": 4}; !maps.Equal(got, want) {
		t.Errorf("pglimit_nodelimit_calls_total on the replica that listed the queues: %v, want %v (4 turns, no kind)", got, want)
	}

	call(t, http.MethodGet, procs[1].URL+"/api/nodes/nope/queues", "alice-token", nil).problemOf(t, http.StatusNotFound, "unknown-node")
	call(t, http.MethodGet, procs[1].URL+"/api/nodes/gone/queues", "alice-token", nil).problemOf(t, http.StatusBadGateway, "node-unreachable")

	// Each replica re-reads the ready count at most every 5 s: wait until
	// every one of them has seen all three and takes a third of the rate.
	deadline := time.Now().Add(15 * time.Second)
	for _, p := range procs {
		for {
			var q struct {
				Rate struct {
					Replica float64 `json:"replica"`
				} `json:"rate"`
			}
			r := call(t, http.MethodGet, p.URL+"/api/nodes/b1/queues", "alice-token", nil)
			if err := jsonUnmarshal(r.Body, &q); err == nil && q.Rate.Replica == 2 {
				break
			}
			if time.Now().After(deadline) {
				lim := call(t, http.MethodGet, p.URL+"/api/limits", "alice-token", nil)
				t.Fatalf("%s never took its share of 2 per second: %s\n%s", p.Name, r.Body, lim.Body)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
	// Full load from all three replicas for four seconds.
	time.Sleep(time.Second) // the bursts of the calls above are spent
	node.Reset()
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var served atomic.Int64
	for i := 0; i < 12; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				r, err := send(ctx, http.MethodGet, procs[i%3].URL+"/api/nodes/b1/queues", []string{"alice-token", "bob-token", "carol-token"}[i%3], nil)
				if err == nil && r.Status == http.StatusOK {
					served.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	st := node.Stats()
	calls := node.Calls()
	t.Logf("served %d; node saw %d calls, per wall-clock second %v", served.Load(), st.Calls, st.PerSecond)
	if len(calls) < 12 {
		t.Fatalf("the node saw only %d calls in 4 s: the load did not reach the limit", len(calls))
	}
	// Past the first second (the replicas' buckets start full: the burst),
	// the node sees the installation's rate: at most 6 calls per second,
	// give or take one call per replica for where each bucket's turns fall.
	from := calls[0].At.Add(time.Second)
	to := calls[len(calls)-1].At
	steady := 0
	for _, c := range calls {
		if !c.At.Before(from) {
			steady++
		}
	}
	span := to.Sub(from).Seconds()
	t.Logf("%d calls in the %.2f s after the first second: %.2f per second", steady, span, float64(steady)/span)
	if limit := 6*span + 3; float64(steady) > limit {
		t.Fatalf("the node saw %d calls in %.2f s: more than the installation rate of 6 per second allows (%.1f)", steady, span, limit)
	}
	if float64(steady) < 4*span {
		t.Fatalf("only %d calls in %.2f s: the load did not keep the limiter busy", steady, span)
	}
}

// TestTokenInFlightAcrossReplicas: with -token-in-flight 2, a token's
// concurrent requests spread over three replicas never run more than two at
// once (pg_stat_activity), and the others are 429
// too-many-requests-in-flight with limit and retryAfter; so too when the
// replicas keep their slots between requests (-token-in-flight-keep).
func TestTokenInFlightAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, keep := range []string{"0", "1s"} {
		t.Run("keep="+keep, func(t *testing.T) { tokenInFlightAcrossReplicas(t, keep) })
	}
}

func tokenInFlightAcrossReplicas(t *testing.T, keep string) {
	procs, dbURL := studio(t, 3, "-token-in-flight", "2", "-token-in-flight-keep", keep, "-sql-console-cap", "20")
	const marker = "inflight-probe"
	stopObserver := observePeak(t, dbURL, marker)
	var ok, refused atomic.Int64
	var wg sync.WaitGroup
	var once sync.Once
	for i := 0; i < 24; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := send(context.Background(), http.MethodPost, procs[i%3].URL+"/api/sql", "alice-token",
				map[string]string{"sql": "SELECT pg_sleep(1), '" + marker + "'"})
			if err != nil {
				t.Error(err)
				return
			}
			switch r.Status {
			case http.StatusOK:
				ok.Add(1)
			case http.StatusTooManyRequests:
				refused.Add(1)
				once.Do(func() {
					m := r.problemOf(t, http.StatusTooManyRequests, "too-many-requests-in-flight")
					if m["limit"] != float64(2) || m["retryAfter"] == nil || r.Header.Get("Retry-After") == "" {
						t.Errorf("in-flight refusal: %v %v", m, r.Header)
					}
				})
			default:
				t.Errorf("%d %s", r.Status, r.Body)
			}
		}()
	}
	wg.Wait()
	peak := stopObserver()
	t.Logf("ok %d, refused %d, peak %d", ok.Load(), refused.Load(), peak)
	if peak > 2 {
		t.Fatalf("pg_stat_activity saw %d requests of one token at once; cap 2", peak)
	}
	if peak < 2 || refused.Load() == 0 {
		t.Fatalf("never reached the cap (peak %d, refused %d)", peak, refused.Load())
	}
}
