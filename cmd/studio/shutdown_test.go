package main_test

import (
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// TestShutdownLandsEveryRelease stops a replica (SIGTERM) while four
// console queries run on it (alice's two and bob's two), each holding a
// user permit, an installation permit and an in-flight slot: twelve slots.
// The queries end together as it shuts down, so their releases — which
// leave without keeping an answer waiting — are all on their way at once.
// The replica sees them to the database before its pools close: once it
// has exited, an observer finds no live slot of it, although their leases
// run an hour.
func TestShutdownLandsEveryRelease(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-sql-console-cap", "2", "-sql-console-time", "1h", "-max-request-time", "1h",
		"-token-in-flight", "8")
	p := procs[0]
	obs := pgtest.Pool(t, dbURL, 1)
	const live = `SELECT count(*) FROM pglimit.slot WHERE replica = $1 AND expires_at > now()`
	var wg sync.WaitGroup
	for _, token := range []string{"alice-token", "alice-token", "bob-token", "bob-token"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := sendWithin(time.Minute, http.MethodPost, p.URL+"/api/sql", token, console("SELECT pg_sleep(2)"))
			if err != nil || r.Status != http.StatusOK {
				t.Errorf("console query during the shutdown: %v %v", r, err)
			}
		}()
	}
	wait.For(t, 20*time.Second, "the queries holding their slots", func() bool { return count(obs, live, p.Name) == 12 })
	held := count(obs, live, p.Name)
	p.Stop()
	wg.Wait()
	if n := count(obs, live, p.Name); n != 0 {
		t.Fatalf("%d of %d slots of the stopped replica still live: a release was lost in the shutdown", n, held)
	}
	t.Logf("%d slots held when the replica was told to stop; none left after it exited", held)
}
