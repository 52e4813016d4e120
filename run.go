package pglimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/housekeep"
	"github.com/pglimit/pglimit/replica"
)

// RunOptions configure Run. The zero value is ready to use.
type RunOptions struct {
	// Replica names this replica in the registry (pglimit.replica); two
	// replicas must not share it. Default host:pid.
	Replica string
	// Heartbeat is the time between two heartbeats of the registry; a
	// replica stops counting as ready three heartbeats after its last.
	// Default 5s, at least 10ms.
	Heartbeat time.Duration
	// Housekeeping is the time between two sweeps of lapsed rows by this
	// replica (one replica sweeps at a time; see package housekeeping).
	// Default one minute.
	Housekeeping time.Duration
	// Registry, when set, is the registry Run runs, instead of one of its
	// own: the service keeps it to report Ready in its /readyz, to Drain
	// at shutdown and to give the node limiter its ReadyReplicas. Replica
	// and Heartbeat must then be left zero (they are the registry's own
	// options). Default: a registry made from Replica and Heartbeat.
	Registry *replica.Registry
	// Logger receives the heartbeat and housekeeping lines. Default
	// slog.Default(), taken when Run starts.
	Logger *slog.Logger
	// MeterProvider gives the meter of housekeeping's counter
	// pglimit.housekeeping.deleted. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Run runs what every replica of a service runs in the background, until
// ctx ends: the replica registry's heartbeat (package replica), the
// housekeeping of lapsed rows (package housekeeping), and the listener of
// invalidations (LISTEN pglimit, on a connection of its own beside the
// pool), which lets the rate limit and the sign-in throttle answer
// refusals that hold until a known time from memory: while it is down,
// and in a service that does not call Run, every decision is a statement.
// When ctx ends it waits for all three (the registry marks its row not
// ready and deletes it) and returns nil.
//
// Options are checked before anything starts, and a bad one is returned at
// once. A part that stops early with an error stops the other one too, and
// Run returns that error: nothing is lost in a goroutine. Start it beside
// the HTTP server:
//
//	go func() { errc <- pglimit.Run(ctx, pool, pglimit.RunOptions{}) }()
func Run(ctx context.Context, pool *pgxpool.Pool, opts RunOptions) error {
	if pool == nil {
		return errors.New("pglimit: Run: nil pool")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	registry := opts.Registry
	if registry != nil && (opts.Replica != "" || opts.Heartbeat != 0) {
		return errors.New("pglimit: Run: RunOptions.Registry is set: leave Replica and Heartbeat zero (they are the registry's own options)")
	}
	if registry == nil {
		var err error
		registry, err = replica.New(pool, replica.Options{Name: opts.Replica, Interval: opts.Heartbeat, Logger: opts.Logger})
		if err != nil {
			return fmt.Errorf("pglimit: Run: %w", err)
		}
	}
	keeper, err := housekeep.New(pool, housekeep.Options{Interval: opts.Housekeeping, Logger: opts.Logger, MeterProvider: opts.MeterProvider})
	if err != nil {
		return fmt.Errorf("pglimit: Run: %w", err)
	}
	listen := func(ctx context.Context) error { return bus.Run(ctx, pool, opts.Logger) }
	return runAll(ctx, registry.Run, keeper.Run, listen)
}

// runAll runs every part until ctx ends, or until one returns an error,
// which ends the others; it returns the errors joined.
func runAll(ctx context.Context, parts ...func(context.Context) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	for _, part := range parts {
		wg.Go(func() {
			if err := part(ctx); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}
