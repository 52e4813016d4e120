package activity_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/activity"
	"github.com/pglimit/pglimit/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// sleepers runs n statements carrying marker for d on pools of url, and
// returns when all have started; wait waits for them to end.
func sleepers(t *testing.T, url, marker string, n int, d time.Duration) (wait func()) {
	t.Helper()
	pool := pgtest.Pool(t, url, int32(n))
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := pool.Exec(context.Background(), "SELECT pg_sleep($1::float8) -- "+marker, d.Seconds()); err != nil {
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
	wait := sleepers(t, as("worker"), "blind-probe", 2, 3*time.Second)
	defer wait()
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

	if _, err := admin.Exec(ctx, `GRANT pg_read_all_stats TO watcher`); err != nil {
		t.Fatal(err)
	}
	observer.Reset() // a new session takes the new membership
	texts, err := activity.Running(ctx, observer, "blind-probe")
	if err != nil || len(texts) != 2 {
		t.Fatalf("with pg_read_all_stats: %d statements, %v; want 2", len(texts), err)
	}
}
