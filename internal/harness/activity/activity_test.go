package activity_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sleepers runs n statements carrying marker on a pool of url, each for d
// or until the test ends; wait waits for them to end.
func sleepers(t *testing.T, url, marker string, n int, d time.Duration) (wait func()) {
	t.Helper()
	pool := pgtest.Pool(t, url, int32(n))
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := pool.Exec(ctx, "SELECT pg_sleep($1::float8) -- "+marker, d.Seconds())
			if err != nil && ctx.Err() == nil {
				t.Error(err)
			}
		}()
	}
	return wg.Wait
}

// TestWatchCountsMarkedStatements: three marked statements on the test's
// database are seen at once, the observer's own statement and unmarked ones
// are not.
func TestWatchCountsMarkedStatements(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	w, err := activity.Watch(context.Background(), url, "activity-probe")
	if err != nil {
		t.Fatal(err)
	}
	wait := sleepers(t, url, "activity-probe", 3, 500*time.Millisecond)
	waitOther := sleepers(t, url, "something-else", 2, 500*time.Millisecond)
	wait()
	waitOther()
	peak, samples, err := w.Stop()
	if err != nil {
		t.Fatal(err)
	}
	if peak != 3 || samples == 0 {
		t.Fatalf("peak %d over %d samples, want 3", peak, samples)
	}
}

// TestBlindObserverFails: an observer whose role may not read another
// role's statements returns a *BlindError naming both roles instead of
// counting nothing, and reads them once it is a member of
// pg_read_all_stats. (A cluster of its own: the test creates roles.)
func TestBlindObserverFails(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	admin := pgtest.Pool(t, c.URL("postgres"), 1)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE ROLE watcher LOGIN`, `CREATE ROLE worker LOGIN`, `CREATE DATABASE app`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	as := func(role string) string { return strings.Replace(c.URL("app"), "postgres@", role+"@", 1) }
	sleepers(t, as("worker"), "blind-probe", 2, time.Minute) // ended with the test
	observer := pgtest.Pool(t, as("watcher"), 1)

	deadline := time.Now().Add(2 * time.Second)
	var blind *activity.BlindError
	for {
		texts, err := activity.Running(ctx, observer, "blind-probe")
		if errors.As(err, &blind) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("a blind observer saw %d statements and no error", len(texts))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if blind.Observer != "watcher" || len(blind.Roles) != 1 || blind.Roles[0] != "worker" ||
		!strings.Contains(blind.Error(), "GRANT pg_read_all_stats TO watcher") {
		t.Fatalf("blind error %+v: %v", blind, blind)
	}

	deadline = time.Now().Add(5 * time.Second)
	if _, err := admin.Exec(ctx, `GRANT pg_read_all_stats TO watcher`); err != nil {
		t.Fatal(err)
	}
	observer.Reset() // a new session takes the new membership
	for {
		texts, err := activity.Running(ctx, observer, "blind-probe")
		if err != nil {
			t.Fatalf("with pg_read_all_stats: %v", err)
		}
		if len(texts) == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("with pg_read_all_stats: %d statements; want 2", len(texts))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestHoldingCountsOpenTransactions: a session whose marked statement is
// done but whose transaction is open is holding, not running.
func TestHoldingCountsOpenTransactions(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	ctx := context.Background()
	pool := pgtest.Pool(t, url, 1)
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, "SELECT 1 -- holding-probe"); err != nil {
		t.Fatal(err)
	}
	observer := pgtest.Pool(t, url, 1)
	running, err := activity.Running(ctx, observer, "holding-probe")
	if err != nil {
		t.Fatal(err)
	}
	holding, err := activity.Holding(ctx, observer, "holding-probe")
	if err != nil {
		t.Fatal(err)
	}
	if len(running) != 0 || len(holding) != 1 {
		t.Fatalf("running %d, holding %d; want 0 and 1", len(running), len(holding))
	}
}
