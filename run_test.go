package pglimit_test

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/replica"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// TestRunHeartbeatsAndSweeps: Run registers the replica and heartbeats it,
// sweeps lapsed rows, and when its context ends removes the replica's row
// and returns nil. An observer pool reads the tables.
func TestRunHeartbeatsAndSweeps(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 4)
	obs := pgtest.Pool(t, url, 1)
	ctx := context.Background()
	if _, err := obs.Exec(ctx, `INSERT INTO pglimit.login_attempt (key, failures, first_at, last_at, expires_at)
		VALUES ('username:lapsed', 3, now() - interval '1 hour', now() - interval '1 hour', now() - interval '1 minute')`); err != nil {
		t.Fatal(err)
	}
	count := func(sql string) int {
		var n int
		if err := obs.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	// Heartbeats 50 ms apart, each statement bounded by 10 s (the default
	// bound is the interval, 50 ms, which a loaded machine's shutdown
	// delete once missed: the row stayed to lapse on its own).
	reg, err := replica.New(pool, replica.Options{Name: "run-test", Interval: 50 * time.Millisecond,
		Timeout: 10 * time.Second, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		done <- pglimit.Run(runCtx, pool, pglimit.RunOptions{Registry: reg, Housekeeping: 50 * time.Millisecond, Logger: quiet})
	}()
	wait.For(t, 15*time.Second, "the replica registered and the lapsed row swept", func() bool {
		return count(`SELECT count(*) FROM pglimit.replica WHERE name = 'run-test' AND ready`) == 1 &&
			count(`SELECT count(*) FROM pglimit.login_attempt`) == 0
	})
	var beat time.Time
	if err := obs.QueryRow(ctx, `SELECT heartbeat_at FROM pglimit.replica WHERE name = 'run-test'`).Scan(&beat); err != nil {
		t.Fatal(err)
	}
	wait.For(t, 15*time.Second, "a second heartbeat", func() bool {
		var now time.Time
		_ = obs.QueryRow(ctx, `SELECT heartbeat_at FROM pglimit.replica WHERE name = 'run-test'`).Scan(&now)
		return now.After(beat)
	})
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v when its context ended, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if n := count(`SELECT count(*) FROM pglimit.replica WHERE name = 'run-test'`); n != 0 {
		t.Errorf("%d registry rows after Run returned, want 0", n)
	}
}

// TestRunOptionErrors are returned at once, before anything starts: no
// row is written.
func TestRunOptionErrors(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 2)
	reg, err := replica.New(pool, replica.Options{Name: "mine", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		opts pglimit.RunOptions
		want string
	}{
		{"heartbeat too short", pglimit.RunOptions{Heartbeat: time.Millisecond}, "at least 10ms"},
		{"negative housekeeping", pglimit.RunOptions{Housekeeping: -time.Second}, "negative"},
		{"blank replica name", pglimit.RunOptions{Replica: " r "}, "blank"},
		{"registry and replica", pglimit.RunOptions{Registry: reg, Replica: "other"}, "Registry"},
		{"registry and heartbeat", pglimit.RunOptions{Registry: reg, Heartbeat: time.Second}, "Registry"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.opts.Logger = quiet
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := pglimit.Run(ctx, pool, tc.opts)
			if err == nil || !strings.Contains(err.Error(), tc.want) || ctx.Err() != nil {
				t.Errorf("Run = %v (context %v), want at once an error naming %q", err, ctx.Err(), tc.want)
			}
		})
	}
	if err := pglimit.Run(context.Background(), nil, pglimit.RunOptions{}); err == nil {
		t.Error("Run with a nil pool: no error")
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.replica`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("%d registry rows after refused options (%v), want none", rows, err)
	}
}

// TestRunReturnsAnEarlyError: a part that stops with an error stops the
// others and Run returns the error, rather than losing it. The registry
// given is already running, so its second Run fails at once.
func TestRunReturnsAnEarlyError(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	reg, err := replica.New(pool, replica.Options{Name: "twice", Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	first := make(chan error, 1)
	go func() { first <- reg.Run(ctx) }()
	wait.For(t, 15*time.Second, "the registry running", reg.Ready)
	errc := make(chan error, 1)
	go func() { errc <- pglimit.Run(ctx, pool, pglimit.RunOptions{Registry: reg, Logger: quiet}) }()
	select {
	case err := <-errc:
		if err == nil || !strings.Contains(err.Error(), "Run called twice") {
			t.Fatalf("Run = %v, want the registry's error: Run called twice", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return the early error (housekeeping kept it running)")
	}
	cancel()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}
