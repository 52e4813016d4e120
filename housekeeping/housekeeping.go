// Package housekeeping deletes the lapsed rows of pglimit's limit tables
// (ADR-0196 decision 5; ADR-0134): permits, in-flight slots, upload slots
// and sign-in throttles that nobody came back to, and replicas that stopped
// heartbeating. A lapsed row already counts for nothing — every claim and
// read ignores it — so housekeeping only keeps the tables and their indexes
// small.
//
// Every replica runs Run in the background. Every Interval (default one
// minute) a replica tries to take a session advisory lock with
// pg_try_advisory_lock on a connection it holds for the whole sweep; the
// replica that gets it deletes the lapsed rows of every table in batches of
// at most Batch rows (default 1000) with FOR UPDATE SKIP LOCKED (the
// *DeleteLapsed queries), then releases the lock. A replica that finds the
// lock taken skips its turn instead of queueing behind it, so at most one
// replica sweeps at any moment (with several replicas the tables are swept
// up to once per replica per interval; a sweep that finds nothing costs one
// small indexed statement per table). A replica that dies mid-sweep drops
// the lock with its session.
//
// Deleted rows are logged through slog and counted in the OpenTelemetry
// counter pglimit.housekeeping.deleted, tagged by table.
package housekeeping

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
)

// Defaults of Options.
const (
	DefaultInterval = time.Minute
	DefaultBatch    = 1000
)

// LockKey is the second key of the session advisory lock
// pg_try_advisory_lock(1199, LockKey) that makes one replica sweep at a
// time (see sql/queries/housekeeping.sql).
const LockKey = 1

// MetricDeleted is the name of the counter of deleted rows, tagged with the
// attribute "table".
const MetricDeleted = "pglimit.housekeeping.deleted"

// Tables are the limit tables swept, in the order they are swept.
var Tables = []string{"heavy_permit", "request_in_flight", "upload_window", "login_attempt", "replica"}

// Options configure a Housekeeper. The zero value is ready to use.
type Options struct {
	// Interval is the time between two sweeps of a replica. Default one
	// minute.
	Interval time.Duration
	// Batch is the most rows one DELETE removes; a table with more lapsed
	// rows is swept in several statements, each its own short transaction.
	// Default 1000.
	Batch int
	// MeterProvider gives the meter of the counter
	// pglimit.housekeeping.deleted. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives a line per sweep that deleted rows, and errors.
	// Default slog.Default().
	Logger *slog.Logger
}

// Result is what one sweep did.
type Result struct {
	// Ran is false when another replica held the lock and this one skipped
	// its turn.
	Ran bool
	// Deleted is the number of rows deleted per table (every table, zero
	// included, when Ran).
	Deleted map[string]int64
}

// Total is the number of rows deleted over all tables.
func (r Result) Total() int64 {
	var n int64
	for _, d := range r.Deleted {
		n += d
	}
	return n
}

// Housekeeper sweeps the limit tables of one database. It is safe for
// concurrent use; concurrent sweeps take turns through the lock.
type Housekeeper struct {
	pool     *pgxpool.Pool
	q        *db.Queries
	interval time.Duration
	batch    int32
	deleted  metric.Int64Counter
	log      *slog.Logger
}

// New returns a Housekeeper over pool.
func New(pool *pgxpool.Pool, opts Options) (*Housekeeper, error) {
	if pool == nil {
		return nil, errors.New("housekeeping: nil pool")
	}
	if opts.Interval < 0 || opts.Batch < 0 {
		return nil, errors.New("housekeeping: negative Interval or Batch")
	}
	if opts.Interval == 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Batch == 0 {
		opts.Batch = DefaultBatch
	}
	if opts.Batch > 1_000_000 {
		return nil, errors.New("housekeeping: Batch above 1000000")
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	counter, err := opts.MeterProvider.Meter("github.com/pglimit/pglimit/housekeeping").Int64Counter(MetricDeleted,
		metric.WithDescription("Lapsed rows of the limit tables deleted by housekeeping."),
		metric.WithUnit("{row}"))
	if err != nil {
		return nil, fmt.Errorf("housekeeping: counter: %w", err)
	}
	return &Housekeeper{pool: pool, q: db.New(), interval: opts.Interval, batch: int32(opts.Batch),
		deleted: counter, log: opts.Logger}, nil
}

// Run sweeps with opts every interval until ctx ends; see Housekeeper.Run.
func Run(ctx context.Context, pool *pgxpool.Pool, opts Options) error {
	h, err := New(pool, opts)
	if err != nil {
		return err
	}
	h.Run(ctx)
	return nil
}

// Run sweeps at once and then every interval, until ctx ends; it returns
// when ctx ends, after the sweep under way (its statements are canceled
// with ctx, and the lock is released). Errors are logged and the next
// interval tries again.
func (h *Housekeeper) Run(ctx context.Context) {
	t := time.NewTicker(h.interval)
	defer t.Stop()
	for {
		if _, err := h.RunOnce(ctx); err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "housekeeping: sweep failed; trying again next interval", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// RunOnce sweeps every table once if no other replica is sweeping: it
// takes the lock on a connection of its own, deletes each table's lapsed
// rows batch after batch until a batch comes back short, and releases the
// lock. Result.Ran is false when the lock was taken. On an error the rows
// deleted so far are in the Result.
func (h *Housekeeper) RunOnce(ctx context.Context) (Result, error) {
	conn, err := h.pool.Acquire(ctx)
	if err != nil {
		return Result{}, fmt.Errorf("housekeeping: connection: %w", err)
	}
	locked, err := h.q.HousekeepingTryLock(ctx, conn, LockKey)
	if err != nil {
		// The lock may be held by the session without our knowing: do not
		// give the connection back to the pool.
		_ = conn.Hijack().Close(context.WithoutCancel(ctx))
		return Result{}, fmt.Errorf("housekeeping: lock: %w", err)
	}
	if !locked {
		conn.Release()
		return Result{}, nil
	}
	defer func() {
		uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if ok, err := h.q.HousekeepingUnlock(uctx, conn, LockKey); err != nil || !ok {
			// Closing the session releases the lock for certain.
			_ = conn.Hijack().Close(uctx)
			return
		}
		conn.Release()
	}()

	res := Result{Ran: true, Deleted: make(map[string]int64, len(Tables))}
	var sweepErr error
	for _, table := range Tables {
		n, err := h.sweep(ctx, conn, table)
		res.Deleted[table] = n
		if n > 0 {
			h.deleted.Add(context.WithoutCancel(ctx), n, metric.WithAttributes(attribute.String("table", table)))
		}
		if err != nil {
			sweepErr = fmt.Errorf("housekeeping: %s: %w", table, err)
			break
		}
	}
	if total := res.Total(); total > 0 {
		args := []any{"total", total}
		for _, t := range Tables {
			args = append(args, t, res.Deleted[t])
		}
		h.log.InfoContext(ctx, "housekeeping: deleted lapsed rows", args...)
	} else {
		h.log.DebugContext(ctx, "housekeeping: nothing lapsed")
	}
	return res, sweepErr
}

// sweep deletes table's lapsed rows in batches until one comes back short.
func (h *Housekeeper) sweep(ctx context.Context, conn db.DBTX, table string) (int64, error) {
	var total int64
	for {
		var n int64
		var err error
		switch table {
		case "heavy_permit":
			n, err = h.q.HeavyPermitDeleteLapsed(ctx, conn, h.batch)
		case "request_in_flight":
			n, err = h.q.RequestInFlightDeleteLapsed(ctx, conn, h.batch)
		case "upload_window":
			n, err = h.q.UploadWindowDeleteLapsed(ctx, conn, h.batch)
		case "login_attempt":
			n, err = h.q.LoginAttemptDeleteLapsed(ctx, conn, h.batch)
		case "replica":
			n, err = h.q.ReplicaDeleteLapsed(ctx, conn, h.batch)
		default:
			return total, fmt.Errorf("unknown table %q", table)
		}
		total += n
		if err != nil {
			return total, err
		}
		if n < int64(h.batch) {
			return total, nil
		}
	}
}
