// Package quota keeps calendar quotas in PostgreSQL: N units per key per
// day, month or year in a configured time zone, reset at the period's
// start, across every replica — what an API sold by plan counts ("10,000
// requests a month, reset on the 1st"). A Limiter needs no HTTP.
//
// # One statement per decision
//
// Acquire and AcquireN charge a key's use in the current period in one
// INSERT ... ON CONFLICT DO UPDATE ... RETURNING (sql/queries/quota_usage.sql):
// the charge is made only when it fits (used + cost <= Limit), two replicas
// charging one key serialise on its row lock, and the period is read from
// the database clock in Options.Location, never from a replica's. A key
// is one row for ever: the first charge of a new period replaces the old
// period's count in place. A refusal is a *LimitError (errors.Is
// pglimit.ErrLimited) whose RetryAfter runs to the period's end — when the
// key has room again.
//
// # Charged after the fact
//
// When the cost is known only once the work is done (rows exported, tokens
// generated, bytes stored), AcquireN reserves an estimate before the work
// and Permit.Settle charges the difference after it: a refund when the work
// cost less, a further charge — made whatever the quota, the work is done —
// when it cost more. The bound: at any moment a key's use passes its Limit
// by at most the sum, over its permits not yet settled, of what each
// settles above its estimate (with settles that never exceed their
// estimate, never). An admission judges the charges settled so far, so a
// key that overshot is refused until its period ends.
//
// # Charged with the business write
//
// With Options.Durable the counts live in the LOGGED pglimit.quota_ledger
// instead of the UNLOGGED pglimit.quota_usage, and ChargeTx charges inside
// the caller's own transaction: the charge is kept exactly when the
// caller's transaction commits, and is gone when it rolls back or the
// server stops before the commit — usage is exactly what committed, which
// billing needs. Two transactions charging one key take turns on its row
// lock until the first ends. (ChargeTx works on quota_usage too, with the
// same commit and rollback, but a crash of the database empties that
// table.) What it costs beside the UNLOGGED decision is in BENCHMARKS.md.
//
// # Looking without spending
//
// Peek reads a key's use without charging, Keys lists the keys with use in
// the current period (paged by key), Reset forgets a key's use.
//
// How it fails: a database that cannot decide is an error pglimit.Classify
// calls ClassUnavailable or ClassTimeout; no error text of the database is
// meant for a client. A crash of the database empties quota_usage (every
// key starts its period again), never quota_ledger.
package quota

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/override"
)

// MaxLimit is the largest Limit a quota takes: 2^53, the largest integer a
// JSON number carries exactly. (Quotas count bytes and rows, so their
// bound is far above pglimit.MaxLimit, the bound of a cap.)
const MaxLimit = vocab.MaxAmount

// Period is a calendar unit a quota is counted in.
type Period int

// The calendar periods.
const (
	// Day runs from midnight to midnight in the Location: 23 or 25 hours
	// on the day of a daylight-saving change.
	Day Period = iota + 1
	// Month runs from the first's midnight to the next month's.
	Month
	// Year runs from the first of January's midnight to the next year's.
	Year
)

// String returns "day", "month" or "year".
func (p Period) String() string {
	switch p {
	case Day:
		return "day"
	case Month:
		return "month"
	case Year:
		return "year"
	}
	return fmt.Sprintf("Period(%d)", int(p))
}

// step is one period as a PostgreSQL interval of calendar units.
func (p Period) step() pgtype.Interval {
	switch p {
	case Day:
		return pgtype.Interval{Days: 1, Valid: true}
	case Month:
		return pgtype.Interval{Months: 1, Valid: true}
	default:
		return pgtype.Interval{Months: 12, Valid: true}
	}
}

// Options configure a Limiter.
type Options struct {
	// Name tells this quota's rows from other quotas' in the shared
	// tables, and names the limit in metrics. Required.
	Name string
	// Limit is the units each key may use per period, 1 to MaxLimit.
	Limit int64
	// Period is the calendar unit: Day, Month or Year. Required.
	Period Period
	// Location is the time zone whose calendar the periods follow; it must
	// be a named zone PostgreSQL knows too (an IANA name such as
	// "Europe/Paris"), not time.Local. Default UTC.
	Location *time.Location
	// Durable keeps the counts in the LOGGED pglimit.quota_ledger: they
	// survive a crash of the database, and ChargeTx commits with the
	// caller's transaction. Default: the UNLOGGED pglimit.quota_usage.
	Durable bool
	// Timeout bounds one decision's round trip. Default 5s.
	Timeout time.Duration
	// DryRun decides, counts and logs, and refuses nobody.
	DryRun bool
	// MeterProvider gives the meter of the decision metrics. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives the dry-run lines. Default slog.Default().
	Logger *slog.Logger
	// Overrides, when set, give keys their own Limit (a customer's plan)
	// under the policy named Name, from memory; a key without one has
	// Limit. An override of 0 allows the key nothing. The Store's Run
	// must run for other replicas' changes to reach it.
	Overrides *override.Store
}

// Limiter charges keys against one calendar quota. It is safe for
// concurrent use.
type Limiter struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	name    string
	limit   int64
	period  Period
	zone    string
	timeout time.Duration
	durable bool
	obs     *observe.Limit
	over    *override.Store
	// at stands in for the database clock in tests (nil: the clock).
	at *time.Time
}

// New returns a Limiter on pool after checking o.
func New(pool *pgxpool.Pool, o Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("quota: nil pool")
	}
	if strings.TrimSpace(o.Name) == "" || len(o.Name) > 200 {
		return nil, errors.New("quota: Name must be 1 to 200 bytes")
	}
	if o.Limit < 1 || o.Limit > MaxLimit {
		return nil, fmt.Errorf("quota: Limit %d is not between 1 and %d", o.Limit, int64(MaxLimit))
	}
	if o.Period < Day || o.Period > Year {
		return nil, errors.New("quota: Period must be Day, Month or Year")
	}
	loc := o.Location
	if loc == nil {
		loc = time.UTC
	}
	zone := loc.String()
	if zone == "Local" || zone == "" {
		return nil, errors.New("quota: Location must be a named zone (an IANA name), not time.Local")
	}
	if _, err := time.LoadLocation(zone); err != nil {
		return nil, fmt.Errorf("quota: Location %q: %v", zone, err)
	}
	if err := vocab.OrDefault("quota", "Timeout", &o.Timeout, 5*time.Second); err != nil {
		return nil, err
	}
	obs, err := observe.New(observe.Options{
		Name: o.Name, Scopes: []string{"key"}, DryRun: o.DryRun,
		MeterProvider: o.MeterProvider, Logger: o.Logger,
	})
	if err != nil {
		return nil, fmt.Errorf("quota: %w", err)
	}
	return &Limiter{
		pool: pool, q: db.New(), name: o.Name, limit: o.Limit, period: o.Period,
		zone: zone, timeout: o.Timeout, durable: o.Durable, obs: obs, over: o.Overrides,
	}, nil
}

// State is a key's use in the current period.
type State struct {
	// Key is the key.
	Key string
	// Limit is the units the key may use per period.
	Limit int64
	// Used is what the key has used in the period; above Limit when
	// settles charged more than their estimates.
	Used int64
	// Remaining is Limit - Used, at least 0.
	Remaining int64
	// PeriodStart and Reset are the period's start and end (when the key
	// has its whole Limit again), on the database clock.
	PeriodStart, Reset time.Time
	// At is when the state was read or the decision made, on the database
	// clock.
	At time.Time
}

// limitOf is key's limit: its override, else Limit.
func (l *Limiter) limitOf(key string) int64 {
	if l.over != nil {
		if n, ok := l.over.Limit(l.name, key); ok {
			return n
		}
	}
	return l.limit
}

func (l *Limiter) state(key string, used int64, start, end, at time.Time) State {
	limit := l.limitOf(key)
	return State{Key: key, Limit: limit, Used: used, Remaining: max(limit-used, 0), PeriodStart: start, Reset: end, At: at}
}

// Permit is a charge that was admitted. Settle corrects it once the real
// cost is known.
type Permit struct {
	// State is the key's use after the charge.
	State
	// Cost is what was charged.
	Cost int64
	// Refusal, in dry run, is the refusal the permit was let through
	// despite; nil otherwise.
	Refusal *LimitError

	l       *Limiter
	tx      pgx.Tx
	settled bool
}

// LimitError is a refused charge.
type LimitError struct {
	// Name is the quota's name.
	Name string
	// Key is the refused key.
	Key string
	// Limit is the units per period.
	Limit int64
	// Cost is what the charge asked for.
	Cost int64
	// State is the key's use, which the refused charge did not change.
	State State
	// RetryAfter is the time until the period ends, when the key has its
	// whole Limit again; 0 when the cost is above Limit (it never fits).
	RetryAfter time.Duration
}

// Error says which quota refused and until when.
func (e *LimitError) Error() string {
	return fmt.Sprintf("quota %s: %d of %d used this period, %d more do not fit (reset %s)",
		e.Name, e.State.Used, e.Limit, e.Cost, e.State.Reset.UTC().Format(time.RFC3339))
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == vocab.ErrLimited }

// Acquire charges one unit to key. It returns a *LimitError when the key
// has used its Limit this period (in dry run: a Permit whose Refusal says
// so).
func (l *Limiter) Acquire(ctx context.Context, key string) (*Permit, error) {
	return l.AcquireN(ctx, key, 1)
}

// AcquireN charges cost units to key when they fit in what is left of
// its Limit this period, else charges nothing and returns a *LimitError.
// A cost of 0 charges nothing and is always admitted. For a cost known only
// after the work, charge an estimate here and Settle the permit after.
func (l *Limiter) AcquireN(ctx context.Context, key string, cost int64) (*Permit, error) {
	return l.charge(ctx, l.pool, nil, key, cost)
}

// ChargeTx charges cost units to key inside tx, the caller's own
// transaction, as AcquireN does: the charge holds the key's row lock until
// tx ends, and is kept exactly when tx commits. With Options.Durable it is
// on the LOGGED ledger and survives a crash once committed. Settle on the
// returned permit runs in tx as well.
func (l *Limiter) ChargeTx(ctx context.Context, tx pgx.Tx, key string, cost int64) (*Permit, error) {
	if tx == nil {
		return nil, errors.New("quota: ChargeTx: nil transaction")
	}
	return l.charge(ctx, tx, tx, key, cost)
}

func (l *Limiter) charge(ctx context.Context, dbtx db.DBTX, tx pgx.Tx, key string, cost int64) (*Permit, error) {
	if cost < 0 || cost > MaxLimit {
		return nil, fmt.Errorf("quota: %w: %d", vocab.ErrInvalidCost, cost)
	}
	limit := l.limitOf(key)
	if cost > limit {
		e := &LimitError{Name: l.name, Key: key, Limit: limit, Cost: cost}
		l.obs.Refused(ctx, "key", key)
		if l.obs.DryRun() {
			return &Permit{l: l, tx: tx, Refusal: e, settled: true, State: State{Key: key, Limit: limit}}, nil
		}
		return nil, e
	}
	start := time.Now()
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	row, err := l.chargeRow(ctx, dbtx, &db.QuotaUsageChargeParams{
		Name: l.name, Key: key, Cost: cost, Quota: limit, At: l.clock(), Zone: l.zone, Unit: l.period.String(), Step: l.period.step(),
	})
	l.obs.Took(ctx, "charge", start)
	if err != nil {
		err = dberr.OwnTimeout(ctx, err)
		l.obs.Failed(ctx, "key", err)
		return nil, fmt.Errorf("quota %s: charge: %w", l.name, err)
	}
	st := l.state(key, row.Used, row.PeriodStart, row.PeriodEnd, row.DecidedAt)
	if row.Allowed {
		l.obs.Granted(ctx, "key")
		return &Permit{State: st, Cost: cost, l: l, tx: tx}, nil
	}
	e := &LimitError{Name: l.name, Key: key, Limit: limit, Cost: cost, State: st, RetryAfter: max(row.PeriodEnd.Sub(row.DecidedAt), 0)}
	l.obs.Refused(ctx, "key", key)
	if l.obs.DryRun() {
		return &Permit{State: st, Refusal: e, l: l, tx: tx, settled: true}, nil
	}
	return nil, e
}

func (l *Limiter) clock() pgtype.Timestamptz {
	if l.at == nil {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: *l.at, Valid: true}
}

// Settle charges the difference between actual, what the admitted work
// really cost, and the permit's Cost: a refund when actual is less (use
// never goes below zero), a further charge, whatever the quota, when it is
// more. A permit settles once (pglimit.ErrSettled after); a dry-run permit that
// was refused, never. It runs even when ctx has ended (the cost was
// incurred): only its own Timeout bounds it. A period that ended since the
// charge is left alone. The permit's State is updated.
func (p *Permit) Settle(ctx context.Context, actual int64) error {
	if actual < 0 || actual > MaxLimit {
		return fmt.Errorf("quota: %w: settle of %d", vocab.ErrInvalidCost, actual)
	}
	if p.settled {
		return vocab.ErrSettled
	}
	p.settled = true
	delta := actual - p.Cost
	if delta == 0 {
		return nil
	}
	l := p.l
	var dbtx db.DBTX = l.pool
	if p.tx != nil {
		dbtx = p.tx
	}
	ctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	r, err := l.settleRow(ctx, dbtx, &db.QuotaUsageSettleParams{Name: l.name, Key: p.Key, PeriodStart: p.PeriodStart, Delta: delta})
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the period ended: its use no longer counts
	}
	if err != nil {
		return fmt.Errorf("quota %s: settle: %w", l.name, dberr.OwnTimeout(ctx, err))
	}
	p.Cost = actual
	p.State = l.state(p.Key, r.Used, p.PeriodStart, p.Reset, p.At)
	return nil
}

// Peek returns key's use in the current period without charging it.
func (l *Limiter) Peek(ctx context.Context, key string) (State, error) {
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	r, err := l.peekRow(ctx, &db.QuotaUsagePeekParams{Name: l.name, Key: key, At: l.clock(), Zone: l.zone, Unit: l.period.String(), Step: l.period.step()})
	if err != nil {
		return State{}, fmt.Errorf("quota %s: peek: %w", l.name, dberr.OwnTimeout(ctx, err))
	}
	return l.state(key, r.Used, r.PeriodStart, r.PeriodEnd, r.At), nil
}

// maxKeys is the most keys one call of Keys returns.
const maxKeys = 1000

// Keys lists the keys with use in the current period, in key order,
// after the key after ("" for the first page), at most max of them (1 to
// 1000). The next page starts after the last key returned.
func (l *Limiter) Keys(ctx context.Context, after string, max int) ([]State, error) {
	if max < 1 || max > maxKeys {
		return nil, fmt.Errorf("quota %s: keys: max %d is not between 1 and %d", l.name, max, maxKeys)
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	rows, err := l.keyRows(ctx, &db.QuotaUsageKeysParams{Name: l.name, After: after, Max: int32(max), At: l.clock(), Zone: l.zone, Unit: l.period.String()})
	if err != nil {
		return nil, fmt.Errorf("quota %s: keys: %w", l.name, dberr.OwnTimeout(ctx, err))
	}
	out := make([]State, 0, len(rows))
	for _, r := range rows {
		out = append(out, l.state(r.Key, r.Used, r.PeriodStart, r.PeriodEnd, time.Time{}))
	}
	return out, nil
}

// Reset forgets key's use: it has its whole Limit again. It reports
// whether the key had a row.
func (l *Limiter) Reset(ctx context.Context, key string) (bool, error) {
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	n, err := l.resetRow(ctx, &db.QuotaUsageResetParams{Name: l.name, Key: key})
	if err != nil {
		return false, fmt.Errorf("quota %s: reset: %w", l.name, dberr.OwnTimeout(ctx, err))
	}
	return n > 0, nil
}
