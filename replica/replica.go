// Package replica is the registry of a service's running replicas: each
// replica keeps a row in the UNLOGGED table pglimit.replica of the database
// they share, and any replica can count the ready ones.
//
// What it guarantees: while a Registry's Run runs (pglimit.Run runs it), its
// row is written at once and refreshed every heartbeat (5 s by default). A
// row counts as ready for three heartbeat intervals after its last
// heartbeat, on the database clock, so a replica that died without cleaning
// up stops counting by itself. Drain marks the replica not ready at once,
// for the others too; when Run's context ends the row is marked not ready
// and deleted. ReadyReplicas counts the ready rows, and counts this
// replica from New on, before its first heartbeat is written, until it
// drains: never fewer than one. Ready says whether this replica's own
// heartbeat is current, for a /readyz endpoint. The node call limiter
// (package nodelimit) divides an upstream node's rate by ReadyReplicas.
//
// What it costs: one small upsert per replica and heartbeat, and one
// indexed count per ReadyReplicas call. New starts nothing and touches no
// database.
//
// How it fails: a heartbeat that fails never stops Run: it is logged once
// (and once again when heartbeats recover), Ready reports false, and the
// next tick tries again. A crash of the database empties the UNLOGGED
// table; the next heartbeat writes the row again, keeping the replica's
// start time. ReadyReplicas returns 1 and the error when the count cannot
// be read.
//
// The SQL is in sql/queries/replica.sql.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/procname"
	"github.com/pglimit/pglimit/internal/tick"
)

// defaultInterval is the heartbeat interval when Options.Interval is zero.
const defaultInterval = 5 * time.Second

// lapse is how many intervals after its last heartbeat a row stops counting
// as ready.
const lapse = 3

// Options configure a Registry. The zero value is ready to use.
type Options struct {
	// Name identifies this replica's row; two replicas must not share it,
	// and it is at most 200 bytes, not blank at either end. Default the
	// host name and the process id, host:pid.
	Name string
	// Interval is the time between heartbeats. A row lapses three
	// intervals after its last heartbeat. Default 5s; at least 10ms.
	Interval time.Duration
	// Timeout bounds one heartbeat, and each statement of Run's clean-up
	// when its context ends. Default: the interval, at most 5s.
	Timeout time.Duration
	// Logger receives heartbeat failures and recoveries. Default
	// slog.Default().
	Logger *slog.Logger
	// Now is the clock Ready measures "recently" with. Default time.Now.
	Now func() time.Time
}

// errStarted is returned by Run when it was called before on the same
// Registry.
var errStarted = errors.New("replica: Run called twice")

// Registry registers this replica and counts the ready ones. It is safe for
// concurrent use.
type Registry struct {
	pool     *pgxpool.Pool
	q        *db.Queries
	name     string
	interval time.Duration
	timeout  time.Duration
	log      *slog.Logger
	now      func() time.Time

	mu          sync.Mutex
	started     bool // Run was called
	stopped     bool // Run ended
	draining    bool
	startedAt   pgtype.Timestamptz // the row's started_at, once registered
	lastOK      time.Time          // when the last successful heartbeat ended
	lastErr     error              // the last heartbeat's error, nil after a success
	heartbeatMu sync.Mutex         // one heartbeat statement at a time, in order
}

// New returns a Registry of the replicas whose rows are in pool's database.
// It checks opts and starts nothing, nor touches the database: Run
// registers the replica.
func New(pool *pgxpool.Pool, opts Options) (*Registry, error) {
	if pool == nil {
		return nil, errors.New("replica: nil pool")
	}
	if opts.Name == "" {
		opts.Name = procname.Default()
	}
	if strings.TrimSpace(opts.Name) != opts.Name || len(opts.Name) > 200 {
		return nil, fmt.Errorf("replica: name %q: blank at either end or longer than 200 bytes", opts.Name)
	}
	if opts.Interval == 0 {
		opts.Interval = defaultInterval
	}
	if opts.Interval < 10*time.Millisecond {
		return nil, fmt.Errorf("replica: interval %v: must be at least 10ms", opts.Interval)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("replica: negative timeout %v", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = min(opts.Interval, 5*time.Second)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Registry{pool: pool, q: db.New(), name: opts.Name, interval: opts.Interval, timeout: opts.Timeout,
		log: opts.Logger, now: opts.Now}, nil
}

// Run registers this replica with a heartbeat at once and then every
// Options.Interval, until ctx ends; it then marks the row not ready and
// deletes it, with a context of its own bounded by Options.Timeout (a row
// it could not delete is logged and lapses three intervals after its last
// heartbeat), and returns nil. A failed heartbeat never stops it: it is
// logged, Ready reports false, and the next tick tries again. pglimit.Run
// calls it; Run may be called once, and a second call returns an error at
// once.
func (r *Registry) Run(ctx context.Context) error {
	r.mu.Lock()
	if r.started {
		r.mu.Unlock()
		return errStarted
	}
	r.started = true
	r.mu.Unlock()

	tick.Every(ctx, r.interval, func(ctx context.Context) {
		// Not canceled with ctx (still bounded by the timeout): a
		// heartbeat in flight when ctx ends finishes before stop's delete
		// is sent, so it cannot reach the server after it and bring the
		// row back. Recorded and logged; the next tick tries again.
		_ = r.heartbeat(context.WithoutCancel(ctx))
	})
	r.stop(context.WithoutCancel(ctx))
	return nil
}

// stop marks the row not ready, then deletes it, each statement bounded by
// the heartbeat timeout.
func (r *Registry) stop(ctx context.Context) {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	errDrain := r.heartbeat(ctx)

	r.heartbeatMu.Lock() // a heartbeat in flight ends before the row goes
	defer r.heartbeatMu.Unlock()
	r.mu.Lock()
	r.stopped = true
	r.mu.Unlock()
	dctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	errDelete := r.q.ReplicaDelete(dctx, r.pool, r.name)
	if errDelete != nil {
		errDelete = fmt.Errorf("replica: delete row: %w", errDelete)
	}
	if err := errors.Join(errDrain, errDelete); err != nil {
		r.log.Warn("replica: could not remove this replica's row at shutdown; it lapses three intervals after its last heartbeat",
			"replica", r.name, "err", err)
	}
}

// heartbeat refreshes this replica's row now (re-creating it when the table
// was emptied) and records the outcome for Ready. Run calls it every
// interval. A failure is logged once when heartbeats start failing and once
// when they recover. After Run has ended it does nothing.
func (r *Registry) heartbeat(ctx context.Context) error {
	r.heartbeatMu.Lock()
	defer r.heartbeatMu.Unlock()
	r.mu.Lock()
	if r.stopped {
		r.mu.Unlock()
		return nil
	}
	ready := !r.draining
	startedAt := r.startedAt
	r.mu.Unlock()

	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	got, err := r.q.ReplicaHeartbeat(ctx, r.pool, &db.ReplicaHeartbeatParams{
		Name: r.name, StartedAt: startedAt, Ready: ready, TtlMs: r.ttl().Milliseconds(),
	})

	r.mu.Lock()
	defer r.mu.Unlock()
	prevErr := r.lastErr
	if err != nil {
		r.lastErr = err
		if prevErr == nil && ctx.Err() == nil {
			r.log.Warn("replica: heartbeat failed; retrying every interval", "replica", r.name, "err", err)
		}
		return fmt.Errorf("replica: heartbeat: %w", err)
	}
	if !r.startedAt.Valid {
		r.startedAt = pgtype.Timestamptz{Time: got, Valid: true}
	}
	r.lastErr = nil
	r.lastOK = r.now()
	if prevErr != nil {
		r.log.Info("replica: heartbeat recovered", "replica", r.name)
	}
	return nil
}

// ttl is how long a heartbeat keeps the row ready.
func (r *Registry) ttl() time.Duration { return lapse * r.interval }

// Ready reports whether this replica is registered and ready: Run is
// running, not draining, its last heartbeat succeeded, and that was less
// than three intervals ago. A service's /readyz reports it.
func (r *Registry) Ready() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.started && !r.stopped && !r.draining && r.lastErr == nil &&
		!r.lastOK.IsZero() && r.now().Sub(r.lastOK) < r.ttl()
}

// lastError is the error of the last heartbeat, nil when it succeeded (or
// none ran yet).
func (r *Registry) lastError() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lastErr
}

// Drain marks this replica not ready, in its row and in Ready, while it
// finishes its work; heartbeats go on with ready false, so the other
// replicas stop counting it at once. Run drains before it deletes the row
// when its context ends; a service calls Drain first, when it stops taking
// requests.
func (r *Registry) Drain(ctx context.Context) error {
	r.mu.Lock()
	r.draining = true
	running := r.started && !r.stopped
	r.mu.Unlock()
	if !running {
		return nil
	}
	return r.heartbeat(ctx)
}

// ReadyReplicas returns the number of ready replicas: rows marked ready
// whose last heartbeat is less than three of their intervals old, and this
// replica itself from New on while its row is not written yet (so that it
// counts at once, before Run's first heartbeat) and until it drains. It is
// never less than 1, the caller itself, even after a crash of the database
// emptied the table. On an error it returns 1 and the error.
func (r *Registry) ReadyReplicas(ctx context.Context) (int, error) {
	// Read whether the row is written before counting: a first heartbeat
	// landing in between is then counted twice, never missed.
	r.mu.Lock()
	unwritten := !r.startedAt.Valid && !r.draining && !r.stopped
	r.mu.Unlock()
	n, err := r.q.ReplicaCountReady(ctx, r.pool)
	if err != nil {
		return 1, fmt.Errorf("replica: count ready: %w", err)
	}
	if unwritten {
		n++
	}
	return max(1, int(n)), nil
}

// row is one row of the registry.
type row struct {
	Name        string
	StartedAt   time.Time // when it registered first
	HeartbeatAt time.Time // its last heartbeat
	Ready       bool      // whether it counts as ready now
	ExpiresAt   time.Time // when the row lapses without another heartbeat
}

// list returns every registered replica, ready or not, by name.
func (r *Registry) list(ctx context.Context) ([]row, error) {
	rows, err := r.q.ReplicaList(ctx, r.pool)
	if err != nil {
		return nil, fmt.Errorf("replica: list: %w", err)
	}
	out := make([]row, len(rows))
	for i, x := range rows {
		out[i] = row{Name: x.Name, StartedAt: x.StartedAt, HeartbeatAt: x.HeartbeatAt, Ready: x.Ready, ExpiresAt: x.ExpiresAt}
	}
	return out, nil
}
