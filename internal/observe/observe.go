// Package observe is what every pglimit limiter does with its decisions,
// written once: it counts them in the OpenTelemetry counter
// pglimit.decisions, times their database work in the histogram
// pglimit.decision.duration, adds refusals to the installation's count per
// minute (pglimit.refusal_minute), and in dry run logs what would have been
// refused and tells the limiter to let the request through.
//
// A limiter makes one Limit in New and calls, per decision, Took for each
// piece of database work and one of Granted, Refused or Failed. No
// attribute ever carries a key: the attributes are the limit's name, the
// outcome, the kind of scope and the kind of work.
package observe

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
)

// Metric names.
const (
	// MetricDecisions counts decisions, with the attributes limit (the
	// limiter's Name), outcome (Granted, Refused, DryRunRefused, Error,
	// Exempt, Banned)
	// and scope (the kind of scope: user, installation, token, key).
	MetricDecisions = "pglimit.decisions"
	// MetricDuration is a histogram of the database work of decisions, in
	// seconds, with the attributes limit and op (Claim, Release, Check,
	// Record).
	MetricDuration = "pglimit.decision.duration"
)

// MeterName is the instrumentation scope of the shared instruments.
const MeterName = "github.com/pglimit/pglimit"

// Outcomes of MetricDecisions.
const (
	Granted       = "granted"
	Refused       = "refused"
	DryRunRefused = "dry-run-refused"
	Error         = "error"
	// Exempt is a request an allow list let past the limit uncounted
	// (package access): neither granted nor refused.
	Exempt = "exempt"
	// Banned is a request refused because its key is banned (package
	// ban), answered from memory.
	Banned = "banned"
)

// Kinds of database work (the attribute op of MetricDuration).
const (
	// Claim takes a slot or permit (heavy, inflight, upload).
	Claim = "claim"
	// Release gives one back.
	Release = "release"
	// Check reads or spends a count to decide (signin's read or
	// reservation, ratelimit's one statement).
	Check = "check"
	// Record writes an outcome after the decision (signin's failure,
	// clear, or given-back reservation).
	Record = "record"
)

// durationBuckets suit work of tens of microseconds to seconds (the
// default buckets of OpenTelemetry start at 5 s for a value in seconds).
var durationBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5}

// Options describe one limit.
type Options struct {
	// Name is the limit's name: the attribute limit, the row of
	// refusal_minute, the dry-run log lines. Required.
	Name string
	// Scopes are the kinds of scope the limit decides in (attribute
	// scope); their attribute sets are made once, here.
	Scopes []string
	// DryRun makes Refused let requests through.
	DryRun bool
	// MeterProvider gives the meter. Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives the dry-run lines and failed writes of refusals.
	// Default slog.Default().
	Logger *slog.Logger
	// DB is where refusals per minute are added (pglimit.refusal_minute);
	// nil keeps them nowhere.
	DB db.DBTX
	// Timeout bounds one write of refusals. Default 5s.
	Timeout time.Duration
}

// Limit observes the decisions of one limit. It is safe for concurrent
// use.
type Limit struct {
	name      string
	dryRun    bool
	log       *slog.Logger
	decisions metric.Int64Counter
	durations metric.Float64Histogram
	outcomes  map[outcomeScope][]metric.AddOption // made once: a call allocates nothing for them
	memory    map[outcomeScope][]metric.AddOption // the same, with source "memory"
	ops       map[string][]metric.RecordOption
	refusals  *minuteCounter
	dryLog    Sampled
}

type outcomeScope struct{ outcome, scope string }

// New makes the instruments of the limit o.Name.
func New(o Options) (*Limit, error) {
	if o.Name == "" {
		return nil, errors.New("observe: no name")
	}
	if o.MeterProvider == nil {
		o.MeterProvider = otel.GetMeterProvider()
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	meter := o.MeterProvider.Meter(MeterName)
	l := &Limit{name: o.Name, dryRun: o.DryRun, log: o.Logger,
		outcomes: map[outcomeScope][]metric.AddOption{}, memory: map[outcomeScope][]metric.AddOption{},
		ops: map[string][]metric.RecordOption{}}
	var err error
	if l.decisions, err = meter.Int64Counter(MetricDecisions,
		metric.WithDescription("Decisions of pglimit's limits, by limit, outcome and kind of scope."),
		metric.WithUnit("{decision}")); err != nil {
		return nil, fmt.Errorf("observe: %s: %w", MetricDecisions, err)
	}
	if l.durations, err = meter.Float64Histogram(MetricDuration,
		metric.WithDescription("Database work of one decision of a pglimit limit (claim, release, check, record)."),
		metric.WithUnit("s"), metric.WithExplicitBucketBoundaries(durationBuckets...)); err != nil {
		return nil, fmt.Errorf("observe: %s: %w", MetricDuration, err)
	}
	for _, scope := range o.Scopes {
		for _, outcome := range []string{Granted, Refused, DryRunRefused, Error, Exempt} {
			l.outcomes[outcomeScope{outcome, scope}] = []metric.AddOption{l.outcomeOption(outcome, scope)}
		}
		for _, outcome := range []string{Granted, Refused, Banned} {
			l.memory[outcomeScope{outcome, scope}] = []metric.AddOption{l.outcomeOption(outcome, scope, attribute.String("source", SourceMemory))}
		}
	}
	for _, op := range []string{Claim, Release, Check, Record} {
		l.ops[op] = []metric.RecordOption{l.opOption(op)}
	}
	if o.DB != nil {
		if o.Timeout <= 0 {
			o.Timeout = 5 * time.Second
		}
		l.refusals = &minuteCounter{db: o.DB, q: db.New(), name: o.Name, dryRun: o.DryRun, timeout: o.Timeout,
			spacing: flushSpacing, log: o.Logger}
	}
	return l, nil
}

func (l *Limit) opOption(op string) metric.RecordOption {
	return metric.WithAttributeSet(attribute.NewSet(attribute.String("limit", l.name), attribute.String("op", op)))
}

func (l *Limit) outcomeOption(outcome, scope string, more ...attribute.KeyValue) metric.AddOption {
	attrs := []attribute.KeyValue{attribute.String("limit", l.name), attribute.String("outcome", outcome)}
	if scope != "" {
		attrs = append(attrs, attribute.String("scope", scope))
	}
	return metric.WithAttributeSet(attribute.NewSet(append(attrs, more...)...))
}

// SourceMemory is the attribute source of a decision made from what a
// replica remembers, with no statement (a refusal that holds until a
// known time, a borrowed unit).
const SourceMemory = "memory"

// GrantedFromMemory counts a decision granted from memory (attribute
// source "memory").
func (l *Limit) GrantedFromMemory(ctx context.Context, scope string) {
	l.decisions.Add(ctx, 1, l.memory[outcomeScope{Granted, scope}]...)
}

// RefusedFromMemory counts a refusal answered from memory (attribute
// source "memory") and adds it to the installation's refusals of this
// minute, as Refused does. A limit in dry run never answers from memory.
func (l *Limit) RefusedFromMemory(ctx context.Context, scope string) {
	if l.refusals != nil {
		l.refusals.add()
	}
	l.decisions.Add(ctx, 1, l.memory[outcomeScope{Refused, scope}]...)
}

// BannedFromMemory counts a request refused because its key is banned
// (outcome banned, source "memory") and adds it to the installation's
// refusals of this minute.
func (l *Limit) BannedFromMemory(ctx context.Context, scope string) {
	if l.refusals != nil {
		l.refusals.add()
	}
	l.decisions.Add(ctx, 1, l.memory[outcomeScope{Banned, scope}]...)
}

// Name is the limit's name.
func (l *Limit) Name() string { return l.name }

// DryRun reports whether the limit refuses nobody.
func (l *Limit) DryRun() bool { return l.dryRun }

// Took records the database work op that began at start. (A measurement
// is recorded whatever ctx's state: the SDK reads ctx only for exemplars.)
func (l *Limit) Took(ctx context.Context, op string, start time.Time) {
	opts, ok := l.ops[op]
	if !ok {
		opts = []metric.RecordOption{l.opOption(op)}
	}
	l.durations.Record(ctx, time.Since(start).Seconds(), opts...)
}

// Released records the database work of a release that took took: a
// permit.Options.OnRelease, called by the Leaser after the release's round
// trip.
func (l *Limit) Released(took time.Duration, _ error) {
	opts, ok := l.ops[Release]
	if !ok {
		opts = []metric.RecordOption{l.opOption(Release)}
	}
	l.durations.Record(context.Background(), took.Seconds(), opts...)
}

func (l *Limit) count(ctx context.Context, outcome, scope string) {
	opts, ok := l.outcomes[outcomeScope{outcome, scope}]
	if !ok {
		opts = []metric.AddOption{l.outcomeOption(outcome, scope)}
	}
	l.decisions.Add(ctx, 1, opts...)
}

// Exempted counts a request the limit let through uncounted because an
// allow list exempts it (outcome exempt): no statement, no refusal.
func (l *Limit) Exempted(ctx context.Context, scope string) { l.count(ctx, Exempt, scope) }

// Granted counts a granted decision in scope.
func (l *Limit) Granted(ctx context.Context, scope string) { l.count(ctx, Granted, scope) }

// Failed counts a decision that could not be made (outcome error), unless
// the caller of ctx went away: a client that left is nobody's failure.
func (l *Limit) Failed(ctx context.Context, scope string, err error) {
	if dberr.IsCanceled(ctx, err) {
		return
	}
	l.count(ctx, Error, scope)
}

// Refused counts a refusal in scope (outcome refused, or dry-run-refused
// in dry run) and adds it to the installation's refusals of this minute.
// In dry run it also logs what it would have refused — at most a line a
// second, with how many it left out; whether the request then goes on is
// the limit's to decide (DryRun), not the metrics'. key is logged, never
// counted; args are added to the line.
func (l *Limit) Refused(ctx context.Context, scope, key string, args ...any) {
	if l.refusals != nil {
		l.refusals.add()
	}
	if !l.dryRun {
		l.count(ctx, Refused, scope)
		return
	}
	l.count(ctx, DryRunRefused, scope)
	l.dryLog.Log(ctx, l.log, slog.LevelInfo, "pglimit: dry run: would refuse",
		append([]any{"limit", l.name, "scope", scope, "key", key}, args...)...)
}

// Sampled writes at most one line a second, and says how many it left out
// since the last. The zero value is ready to use.
type Sampled struct {
	mu      sync.Mutex
	last    time.Time
	skipped int64
}

// Log writes the line through log unless one was written less than a
// second ago.
func (s *Sampled) Log(ctx context.Context, log *slog.Logger, level slog.Level, msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	if !s.last.IsZero() && now.Sub(s.last) < time.Second {
		s.skipped++
		s.mu.Unlock()
		return
	}
	skipped := s.skipped
	s.last, s.skipped = now, 0
	s.mu.Unlock()
	if skipped > 0 {
		args = append(args, "left_out", skipped)
	}
	log.Log(ctx, level, msg, args...)
}

// Counter is the counter name of the meter scope from mp
// (otel.GetMeterProvider() when nil), with its description and unit: the
// one instrument of a part that is not a limit (housekeeping, the read
// router).
func Counter(mp metric.MeterProvider, scope, name, description, unit string) (metric.Int64Counter, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	c, err := mp.Meter(scope).Int64Counter(name, metric.WithDescription(description), metric.WithUnit(unit))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return c, nil
}
