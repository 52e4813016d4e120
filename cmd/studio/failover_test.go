package main_test

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestFailoverUnderLoad: two replicas of the service on a primary and its
// streaming standby, named together with target_session_attrs=read-write.
// Under load the primary dies (immediate stop) and the standby is
// promoted: no request is ever answered 500 (503 at most while no primary
// answers), both replicas serve again without a restart, and the limits
// count again on the new primary — the sign-in throttle from zero (its
// UNLOGGED table starts empty there), seen by an observer on the new
// primary's login_attempt.
func TestFailoverUnderLoad(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("a primary, a standby and a promotion")
	}
	primary, standby := pgtest.WithReplica(t, studioMigration)
	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/app?sslmode=disable&target_session_attrs=read-write",
		primary.Port, standby.Port)
	// The load signs in from 127.0.0.1 far above the client address's
	// rate, which this test does not judge: -address-rate 0.
	procs := studioOn(t, url, 2, "-sign-in-failures", "3", "-sign-in-window", "10m", "-heartbeat", "500ms", "-address-rate", "0")

	var (
		mu           sync.Mutex
		statuses     = map[int]int{}
		fivehundreds []string
		promoted     atomic.Int64 // unix nanos of the promotion; 0 before
		firstOK      [2]atomic.Int64
	)
	ctx, stop := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 4 {
		p := procs[(i/2)%2]
		wg.Go(func() {
			for ctx.Err() == nil {
				rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				var r *response
				var err error
				if i%2 == 0 {
					r, err = send(rctx, http.MethodGet, p.URL+"/api/events?size=1", "alice-token", nil)
				} else {
					r, err = send(rctx, http.MethodPost, p.URL+"/api/session", "", map[string]string{"username": fmt.Sprintf("load-%d", i), "password": "wrong"})
				}
				cancel()
				if err != nil {
					if ctx.Err() == nil {
						t.Errorf("replica %s: %v (the service must answer, not drop the request)", p.Name, err)
					}
					return
				}
				mu.Lock()
				statuses[r.Status]++
				if r.Status >= 500 && r.Status != http.StatusServiceUnavailable {
					fivehundreds = append(fivehundreds, fmt.Sprintf("%s %d %s", p.Name, r.Status, r.Body))
				}
				mu.Unlock()
				if at := promoted.Load(); at != 0 && r.Status == http.StatusOK && i%2 == 0 {
					firstOK[indexOf(procs, p)].CompareAndSwap(0, time.Now().UnixNano()-at)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
	time.Sleep(2 * time.Second)
	if err := primary.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Second)
	admin := pgtest.Pool(t, standby.URL("postgres"), 1)
	if _, err := admin.Exec(context.Background(), "SELECT pg_promote(wait => true)"); err != nil {
		t.Fatal(err)
	}
	promoted.Store(time.Now().UnixNano())
	deadline := time.Now().Add(30 * time.Second)
	for firstOK[0].Load() == 0 || firstOK[1].Load() == 0 {
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(time.Second)
	stop()
	wg.Wait()
	t.Logf("answers by status over the failover: %v; first 200 after the promotion: %v and %v",
		statuses, time.Duration(firstOK[0].Load()), time.Duration(firstOK[1].Load()))
	if len(fivehundreds) > 0 {
		t.Fatalf("%d answers were 5xx other than 503, e.g. %s", len(fivehundreds), fivehundreds[0])
	}
	for i := range firstOK {
		if firstOK[i].Load() == 0 {
			t.Fatalf("replica %s served no 200 within 30 s of the promotion", procs[i].Name)
		}
	}
	for _, p := range procs {
		if !p.Running() {
			t.Fatalf("replica %s stopped: it must live through the failover", p.Name)
		}
	}

	// The throttle counts again, on the new primary, across both replicas.
	for i := range 3 {
		call(t, http.MethodPost, procs[i%2].URL+"/api/session", "", map[string]string{"username": "carol", "password": "wrong"}).
			problemOf(t, http.StatusUnauthorized, "invalid-credentials")
	}
	call(t, http.MethodPost, procs[1].URL+"/api/session", "", map[string]string{"username": "carol", "password": "studio"}).
		problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")
	var failures int
	if err := pgtest.Pool(t, standby.URL("app"), 1).QueryRow(context.Background(),
		"SELECT failures FROM pglimit.login_attempt WHERE key = 'username:carol'").Scan(&failures); err != nil || failures != 3 {
		t.Fatalf("the new primary's login_attempt for carol: %d failures, %v; want 3", failures, err)
	}
	for _, p := range procs {
		if r := call(t, http.MethodGet, p.URL+"/readyz", "", nil); r.Status != http.StatusOK {
			t.Errorf("replica %s /readyz after the failover: %d %s", p.Name, r.Status, r.Body)
		}
	}
}

func indexOf[T comparable](s []T, v T) int {
	for i, x := range s {
		if x == v {
			return i
		}
	}
	return -1
}
