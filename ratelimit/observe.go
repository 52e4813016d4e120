package ratelimit

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metricIncidents counts incidents: runs of failed decisions, from the
// first to the next decision that succeeds, with the attributes limit and
// fail (open or closed). No attribute carries a key.
const metricIncidents = "pglimit.ratelimit.incidents"

// scopeKey is the kind of scope of every decision (attribute scope): the
// key a request is counted against.
const scopeKey = "key"

const meterName = "github.com/pglimit/pglimit/ratelimit"

func newIncidentCounter(mp metric.MeterProvider) (metric.Int64Counter, error) {
	c, err := mp.Meter(meterName).Int64Counter(metricIncidents,
		metric.WithDescription("Runs of rate-limit decisions that failed (the database could not be reached or answered an error)."),
		metric.WithUnit("{incident}"))
	if err != nil {
		return nil, fmt.Errorf("ratelimit: metric: %w", err)
	}
	return c, nil
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
	i.l.incidents.Add(context.WithoutCancel(ctx), 1, i.failMode)
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
