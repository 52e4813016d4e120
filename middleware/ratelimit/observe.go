package ratelimit

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// Metric names. No attribute carries a key.
const (
	// MetricDecisions counts decisions, with the attributes limit (the
	// limiter's Name), outcome (granted, refused, dry-run-refused, error)
	// and scope (key).
	MetricDecisions = "pglimit.decisions"
	// MetricDuration is a histogram of the database work of each decision,
	// in seconds, with the attribute limit.
	MetricDuration = "pglimit.decision.duration"
	// MetricIncidents counts incidents: runs of failed decisions, from the
	// first to the next decision that succeeds, with the attributes limit
	// and fail (open or closed).
	MetricIncidents = "pglimit.ratelimit.incidents"
)

// Outcomes of MetricDecisions.
const (
	outcomeGranted       = "granted"
	outcomeRefused       = "refused"
	outcomeDryRunRefused = "dry-run-refused"
	outcomeError         = "error"
)

const meterName = "github.com/pglimit/pglimit/middleware/ratelimit"

type metrics struct {
	decisions metric.Int64Counter
	durations metric.Float64Histogram
	incidents metric.Int64Counter
	outcomes  map[string]metric.MeasurementOption
	limit     metric.MeasurementOption
	limitName string
}

func newMetrics(mp metric.MeterProvider, name string) (*metrics, error) {
	meter := mp.Meter(meterName)
	m := &metrics{outcomes: map[string]metric.MeasurementOption{}, limitName: name,
		limit: metric.WithAttributeSet(attribute.NewSet(attribute.String("limit", name)))}
	var err error
	if m.decisions, err = meter.Int64Counter(MetricDecisions,
		metric.WithDescription("Decisions of pglimit's limits, by limit and outcome."), metric.WithUnit("{decision}")); err != nil {
		return nil, fmt.Errorf("ratelimit: metric: %w", err)
	}
	if m.durations, err = meter.Float64Histogram(MetricDuration,
		metric.WithDescription("Database work of one decision of a pglimit limit."), metric.WithUnit("s")); err != nil {
		return nil, fmt.Errorf("ratelimit: metric: %w", err)
	}
	if m.incidents, err = meter.Int64Counter(MetricIncidents,
		metric.WithDescription("Runs of rate-limit decisions that failed (the database could not be reached or answered an error)."),
		metric.WithUnit("{incident}")); err != nil {
		return nil, fmt.Errorf("ratelimit: metric: %w", err)
	}
	for _, o := range []string{outcomeGranted, outcomeRefused, outcomeDryRunRefused, outcomeError} {
		m.outcomes[o] = metric.WithAttributeSet(attribute.NewSet(
			attribute.String("limit", name), attribute.String("outcome", o), attribute.String("scope", "key")))
	}
	return m, nil
}

func (m *metrics) decided(ctx context.Context, outcome string) {
	m.decisions.Add(context.WithoutCancel(ctx), 1, m.outcomes[outcome])
}

func (m *metrics) duration(ctx context.Context, d time.Duration) {
	m.durations.Record(context.WithoutCancel(ctx), d.Seconds(), m.limit)
}

// incidents logs and counts runs of failed decisions once each: a line
// when the first decision fails, and one when a decision succeeds again,
// with how long it lasted and how many requests it touched.
type incidents struct {
	l        *Limiter
	active   atomic.Bool
	mu       sync.Mutex
	since    time.Time
	requests int64
	failMode metric.MeasurementOption
	mode     string
}

func (i *incidents) init(l *Limiter) {
	i.l = l
	i.mode = "closed"
	if l.failOpen {
		i.mode = "open"
	}
	i.failMode = metric.WithAttributeSet(attribute.NewSet(attribute.String("limit", l.name), attribute.String("fail", i.mode)))
}

// failed records a failed decision.
func (i *incidents) failed(ctx context.Context, err error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.active.Load() {
		i.requests++
		return
	}
	i.active.Store(true)
	i.since = time.Now()
	i.requests = 1
	i.l.metrics.incidents.Add(context.WithoutCancel(ctx), 1, i.failMode)
	if isUnavailable(err) {
		what := "requests are refused (503 database-unavailable)"
		if i.l.failOpen {
			what = "requests pass uncounted (fail open)"
		}
		i.l.log.WarnContext(ctx, "ratelimit: the database cannot be reached or does not answer in time; "+what+" until it answers",
			"limit", i.l.name, "fail", i.mode, "err", err)
		return
	}
	i.l.log.ErrorContext(ctx, "ratelimit: decisions fail; requests are answered 500 until one succeeds",
		"limit", i.l.name, "err", err)
}

// recovered records a decision that succeeded.
func (i *incidents) recovered(ctx context.Context) {
	if !i.active.Load() {
		return
	}
	i.mu.Lock()
	defer i.mu.Unlock()
	if !i.active.Load() {
		return
	}
	i.active.Store(false)
	i.l.log.InfoContext(ctx, "ratelimit: decisions succeed again", "limit", i.l.name, "fail", i.mode,
		"lasted", time.Since(i.since).Round(time.Millisecond), "failed_requests", i.requests)
}

// sampledLog writes at most one line a second, and says how many it left
// out since the last.
type sampledLog struct {
	mu      sync.Mutex
	last    time.Time
	skipped int64
}

func (s *sampledLog) log(ctx context.Context, log *slog.Logger, level slog.Level, msg string, args ...any) {
	s.mu.Lock()
	now := time.Now()
	if now.Sub(s.last) < time.Second {
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
