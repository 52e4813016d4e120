// Package observetest reads, in tests, the metrics every pglimit limiter
// writes through internal/observe.
package observetest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglimit/pglimit/internal/observe"
)

// Meter is a MeterProvider for a limiter's Options and the reader of what
// it records.
type Meter struct {
	*sdkmetric.MeterProvider
	Reader *sdkmetric.ManualReader
}

// New returns a Meter reading on demand.
func New() *Meter {
	r := sdkmetric.NewManualReader()
	return &Meter{MeterProvider: sdkmetric.NewMeterProvider(sdkmetric.WithReader(r)), Reader: r}
}

func (m *Meter) collect(t testing.TB) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := m.Reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	return rm
}

// Decisions are the counts of pglimit.decisions by "limit outcome scope"
// (the scope left out where there is none).
func (m *Meter) Decisions(t testing.TB) map[string]int64 {
	t.Helper()
	return m.Counts(t, observe.MetricDecisions, "limit", "outcome", "scope")
}

// Counts are the sums of the integer counter name by the values of the
// attributes keys, joined by spaces.
func (m *Meter) Counts(t testing.TB, name string, keys ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, sm := range m.collect(t).ScopeMetrics {
		for _, mt := range sm.Metrics {
			sum, ok := mt.Data.(metricdata.Sum[int64])
			if mt.Name != name || !ok {
				continue
			}
			for _, dp := range sum.DataPoints {
				out[join(dp.Attributes, keys...)] += dp.Value
			}
		}
	}
	return out
}

// Durations are the numbers of observations of pglimit.decision.duration
// by "limit op".
func (m *Meter) Durations(t testing.TB) map[string]uint64 {
	t.Helper()
	out := map[string]uint64{}
	for _, sm := range m.collect(t).ScopeMetrics {
		for _, mt := range sm.Metrics {
			h, ok := mt.Data.(metricdata.Histogram[float64])
			if mt.Name != observe.MetricDuration || !ok {
				continue
			}
			for _, dp := range h.DataPoints {
				out[join(dp.Attributes, "limit", "op")] += dp.Count
			}
		}
	}
	return out
}

func join(set attribute.Set, keys ...string) string {
	var parts []string
	for _, k := range keys {
		if v, ok := set.Value(attribute.Key(k)); ok {
			parts = append(parts, v.AsString())
		}
	}
	return strings.Join(parts, " ")
}

// Refusals are the refusals of the last 15 minutes by limit, as
// pglimit.Refusals reads them (through observe.Recent) from the
// installation's table: "name" for refused, "name dry-run" for
// dry-run-refused.
func Refusals(t testing.TB, pool *pgxpool.Pool) map[string]int64 {
	t.Helper()
	m, err := observe.Recent(context.Background(), pool, 15)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, l := range m.Limits {
		for i := range m.Minutes {
			if n := l.Refused[i]; n > 0 {
				out[l.Name] += n
			}
			if n := l.DryRunRefused[i]; n > 0 {
				out[l.Name+" dry-run"] += n
			}
		}
	}
	return out
}

// WaitRefusals waits, up to 20 s, until Refusals equals want (the
// limiters write them about once a second), and fails the test with what
// it last read otherwise.
func WaitRefusals(t testing.TB, pool *pgxpool.Pool, want map[string]int64) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := Refusals(t, pool)
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("refusals per minute: %v, want %v", got, want)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Logs keeps what a limiter logs, for a test to count lines in.
type Logs struct {
	mu sync.Mutex
	b  bytes.Buffer
}

// Logger writes text lines into l.
func (l *Logs) Logger() *slog.Logger { return slog.New(slog.NewTextHandler(l, nil)) }

func (l *Logs) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *Logs) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Count is how often s occurs in what was logged.
func (l *Logs) Count(s string) int { return strings.Count(l.String(), s) }
