// Package housekeep deletes the lapsed rows of pglimit's limit tables; it
// is what pglimit.Run runs every interval and what housekeeping.Sweep runs
// once. The guarantees, costs and failures are in the doc of package
// housekeeping.
//
// Each batch of a sweep is a short transaction of its own that first tries
// the housekeeping lock (pg_try_advisory_xact_lock(1199, LockKey)): a
// replica that finds it taken at its first batch skips its turn instead of
// queueing behind it, and one that finds it taken later leaves the rest of
// the sweep to the replica that has it. The lock ends with its transaction,
// so a replica that dies mid-sweep holds nothing and the sweep works
// through PgBouncer in transaction pooling mode.
package housekeep

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/citus"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/tick"
)

// Defaults of Options.
const (
	DefaultInterval = time.Minute
	DefaultBatch    = 1000
)

// LockKey is the second key of the transaction-scoped advisory lock
// pg_try_advisory_xact_lock(1199, LockKey) each batch of a sweep takes, so
// that one replica sweeps at a time (see sql/queries/housekeeping.sql).
const LockKey = 1

// MetricDeleted is the name of the counter of deleted rows, tagged with the
// attribute "table".
const MetricDeleted = "pglimit.housekeeping.deleted"

// Tables are the limit tables swept, in the order they are swept (the
// slot tables first, in one statement).
var Tables = []string{"heavy_permit", "request_in_flight", "upload_window", "login_attempt", "replica", "api_request_window", "refusal_minute", "quota_usage", "quota_ledger", "ban", "access_rule"}

// Options configure a Housekeeper. The zero value is ready to use.
type Options struct {
	// Interval is the time between two sweeps of a replica. Default one
	// minute.
	Interval time.Duration
	// Batch is the most rows one DELETE removes; a table with more lapsed
	// rows is swept in several statements, each its own short transaction.
	// Default 1000.
	Batch int
	// Timeout bounds each batch (its transaction), so a database that stops
	// answering ends a sweep instead of hanging it. Default 30s.
	Timeout time.Duration
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
	timeout  time.Duration
	deleted  metric.Int64Counter
	log      *slog.Logger
	citus    citus.Detector
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
	if opts.Timeout < 0 {
		return nil, errors.New("housekeeping: negative Timeout")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 30 * time.Second
	}
	if opts.Batch > 1_000_000 {
		return nil, errors.New("housekeeping: Batch above 1000000")
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	counter, err := observe.Counter(opts.MeterProvider, "github.com/pglimit/pglimit/housekeeping", MetricDeleted,
		"Lapsed rows of the limit tables deleted by housekeeping.", "{row}")
	if err != nil {
		return nil, fmt.Errorf("housekeeping: %w", err)
	}
	return &Housekeeper{pool: pool, q: db.New(), interval: opts.Interval, batch: int32(opts.Batch),
		timeout: opts.Timeout, deleted: counter, log: opts.Logger}, nil
}

// Run sweeps at once and then every interval, until ctx ends; it then
// returns nil, after the sweep under way (its statements are canceled with
// ctx). A failed sweep is logged and the next interval tries again.
func (h *Housekeeper) Run(ctx context.Context) error {
	tick.Every(ctx, h.interval, func(ctx context.Context) {
		if _, err := h.RunOnce(ctx); err != nil && ctx.Err() == nil {
			h.log.WarnContext(ctx, "housekeeping: sweep failed; trying again next interval", "err", err)
		}
	})
	return nil
}

// sweeper deletes at most batch lapsed rows of the tables it covers, in the
// transaction it is given, and counts them by table. On Citus (onShards)
// the distributed tables are swept whole, on every shard at once: a
// statement over all shards cannot skip locked rows.
type sweeper func(ctx context.Context, tx pgx.Tx, q *db.Queries, batch int32, onShards bool) (map[string]int64, error)

// sweepers cover every limit table.
var sweepers = []sweeper{
	sweepSlots,
	distributed("login_attempt", (*db.Queries).LoginAttemptDeleteLapsed, (*db.Queries).LoginAttemptDeleteLapsedAll),
	batches("replica", (*db.Queries).ReplicaDeleteLapsed),
	distributed("api_request_window", (*db.Queries).APIRequestWindowDeleteLapsed, (*db.Queries).APIRequestWindowDeleteLapsedAll),
	batches("refusal_minute", (*db.Queries).RefusalMinuteDeleteLapsed),
	// The calendar quotas' tables stay on the Citus coordinator: batches
	// everywhere.
	batches("quota_usage", (*db.Queries).QuotaUsageDeleteLapsed),
	batches("quota_ledger", (*db.Queries).QuotaLedgerDeleteLapsed),
	distributed("ban", (*db.Queries).BanDeleteLapsed, (*db.Queries).BanDeleteLapsedAll),
	// The allow and deny lists stay on the Citus coordinator too: batches
	// everywhere. A lapsed rule is in force nowhere already; deleting it
	// tells no replica.
	batches("access_rule", (*db.Queries).AccessRuleDeleteLapsed),
}

// sweepSlots sweeps the slot tables: one statement on their parent,
// pglimit.slot, counted by kind (a kind is its partition's name).
func sweepSlots(ctx context.Context, tx pgx.Tx, q *db.Queries, batch int32, onShards bool) (map[string]int64, error) {
	var rows []*db.SlotDeleteLapsedRow
	var err error
	if onShards {
		var all []*db.SlotDeleteLapsedAllRow
		all, err = q.SlotDeleteLapsedAll(ctx, tx)
		for _, r := range all {
			rows = append(rows, (*db.SlotDeleteLapsedRow)(r))
		}
	} else {
		rows, err = q.SlotDeleteLapsed(ctx, tx, batch)
	}
	out := map[string]int64{}
	for _, r := range rows {
		out[r.Kind] = r.Deleted
	}
	return out, err
}

// batches sweeps table with batched in batches, on Citus too (a table that
// stays on the coordinator).
func batches(table string, batched func(*db.Queries, context.Context, db.DBTX, int32) (int64, error)) sweeper {
	return func(ctx context.Context, tx pgx.Tx, q *db.Queries, batch int32, _ bool) (map[string]int64, error) {
		n, err := batched(q, ctx, tx, batch)
		return map[string]int64{table: n}, err
	}
}

// distributed sweeps table with batched in batches, or, on Citus, whole on
// every shard with all.
func distributed(table string, batched func(*db.Queries, context.Context, db.DBTX, int32) (int64, error),
	all func(*db.Queries, context.Context, db.DBTX) (int64, error)) sweeper {
	inBatches := batches(table, batched)
	return func(ctx context.Context, tx pgx.Tx, q *db.Queries, batch int32, onShards bool) (map[string]int64, error) {
		if !onShards {
			return inBatches(ctx, tx, q, batch, onShards)
		}
		n, err := all(q, ctx, tx)
		return map[string]int64{table: n}, err
	}
}

// errLockTaken ends a sweep another replica is running.
var errLockTaken = errors.New("housekeeping: another replica sweeps")

// RunOnce sweeps every table once if no other replica is sweeping: batch
// after batch, each a transaction of its own that takes the housekeeping
// lock and deletes at most Batch lapsed rows, until a batch comes back
// short. Result.Ran is false when another replica held the lock at the
// first batch; a replica that takes the lock between two batches of this
// one ends this sweep early. On an error the rows deleted so far are in the
// Result.
func (h *Housekeeper) RunOnce(ctx context.Context) (Result, error) {
	res := Result{Ran: true, Deleted: make(map[string]int64, len(Tables))}
	for _, t := range Tables {
		res.Deleted[t] = 0
	}
	first := true
	var sweepErr error
sweep:
	for _, sw := range sweepers {
		for {
			got, err := h.batchOnce(ctx, sw)
			if errors.Is(err, errLockTaken) {
				if first {
					return Result{}, nil
				}
				break sweep
			}
			first = false
			var n int64
			for table, d := range got {
				res.Deleted[table] += d
				n += d
				if d > 0 {
					h.deleted.Add(context.WithoutCancel(ctx), d, metric.WithAttributes(attribute.String("table", table)))
				}
			}
			if err != nil {
				sweepErr = fmt.Errorf("housekeeping: %w", err)
				break sweep
			}
			if n < int64(h.batch) {
				break
			}
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

// batchOnce runs one batch of sw in a transaction holding the housekeeping
// lock; errLockTaken when another replica holds it.
func (h *Housekeeper) batchOnce(ctx context.Context, sw sweeper) (map[string]int64, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	tx, err := h.pool.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	locked, err := h.q.HousekeepingTryLock(ctx, tx, LockKey)
	if err != nil {
		return nil, err
	}
	if !locked {
		return nil, errLockTaken
	}
	onShards, err := h.citus.On(ctx, tx)
	if err != nil {
		return nil, err
	}
	got, err := sw(ctx, tx, h.q, h.batch, onShards)
	if err != nil {
		return got, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	return got, nil
}
