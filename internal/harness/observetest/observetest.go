// Package observetest reads, in tests, the metrics every pglimit limiter
// writes through internal/observe.
package observetest

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/embedded"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pglimit/pglimit/internal/observe"
)

// Meter is a MeterProvider for a limiter's Options that keeps, in memory,
// the sums of its integer counters and the counts of its float histograms
// by attribute set, for a test to read. It is not the OpenTelemetry SDK on
// purpose: every requirement of the library's go.mod, test-only ones
// included, lands in an adopter's module graph (issue 44), and pglimit
// records through Int64Counter and Float64Histogram only; every other
// instrument a Meter gives records nothing (TestMeterRecords).
type Meter struct {
	embedded.MeterProvider

	mu     sync.Mutex
	points map[pointKey]*point
}

type pointKey struct {
	name  string
	attrs attribute.Distinct
}

// point is what one instrument recorded under one attribute set.
type point struct {
	kind  string // "counter" or "histogram"
	attrs attribute.Set
	sum   int64  // a counter's
	count uint64 // a histogram's observations
}

// New returns an empty Meter.
func New() *Meter { return &Meter{points: map[pointKey]*point{}} }

// Meter returns a meter whose counters and histograms record into m.
func (m *Meter) Meter(string, ...metric.MeterOption) metric.Meter { return recordingMeter{rec: m} }

func (m *Meter) record(kind, name string, attrs attribute.Set, add int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	k := pointKey{name, attrs.Equivalent()}
	p := m.points[k]
	if p == nil {
		p = &point{kind: kind, attrs: attrs}
		m.points[k] = p
	}
	if kind == "histogram" {
		p.count++
		return
	}
	p.sum += add
}

type recordingMeter struct {
	noop.Meter
	rec *Meter
}

func (r recordingMeter) Int64Counter(name string, _ ...metric.Int64CounterOption) (metric.Int64Counter, error) {
	return int64Counter{rec: r.rec, name: name}, nil
}

func (r recordingMeter) Float64Histogram(name string, _ ...metric.Float64HistogramOption) (metric.Float64Histogram, error) {
	return float64Histogram{rec: r.rec, name: name}, nil
}

type int64Counter struct {
	noop.Int64Counter
	rec  *Meter
	name string
}

func (c int64Counter) Add(_ context.Context, incr int64, opts ...metric.AddOption) {
	c.rec.record("counter", c.name, metric.NewAddConfig(opts).Attributes(), incr)
}

func (c int64Counter) Enabled(context.Context) bool { return true }

type float64Histogram struct {
	noop.Float64Histogram
	rec  *Meter
	name string
}

func (h float64Histogram) Record(_ context.Context, _ float64, opts ...metric.RecordOption) {
	h.rec.record("histogram", h.name, metric.NewRecordConfig(opts).Attributes(), 0)
}

func (h float64Histogram) Enabled(context.Context) bool { return true }

// Decisions are the counts of pglimit.decisions by "limit outcome scope"
// (the scope left out where there is none).
func (m *Meter) Decisions(t testing.TB) map[string]int64 {
	t.Helper()
	return m.Counts(t, observe.MetricDecisions, "limit", "outcome", "scope")
}

// Counts are the sums of the integer counter name by the values of the
// attributes keys, joined by spaces (an attribute a point lacks left out).
func (m *Meter) Counts(t testing.TB, name string, keys ...string) map[string]int64 {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int64{}
	for k, p := range m.points {
		if k.name == name && p.kind == "counter" {
			out[join(p.attrs, keys...)] += p.sum
		}
	}
	return out
}

// Point is what one instrument recorded under one attribute set.
type Point struct {
	Name       string
	Counter    bool          // an Int64Counter's, else a Float64Histogram's
	Attributes attribute.Set // the set it was recorded under
	Sum        int64         // a counter's sum
	Count      uint64        // a histogram's number of observations
}

// Points is everything m recorded, sorted by name and attribute set.
func (m *Meter) Points() []Point {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Point, 0, len(m.points))
	for k, p := range m.points {
		out = append(out, Point{Name: k.name, Counter: p.kind == "counter", Attributes: p.attrs, Sum: p.sum, Count: p.count})
	}
	enc := attribute.DefaultEncoder()
	sort.Slice(out, func(i, j int) bool {
		if out[i].Name != out[j].Name {
			return out[i].Name < out[j].Name
		}
		return out[i].Attributes.Encoded(enc) < out[j].Attributes.Encoded(enc)
	})
	return out
}

// Durations are the numbers of observations of pglimit.decision.duration
// by "limit op".
func (m *Meter) Durations(t testing.TB) map[string]uint64 {
	t.Helper()
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]uint64{}
	for k, p := range m.points {
		if k.name == observe.MetricDuration && p.kind == "histogram" {
			out[join(p.attrs, "limit", "op")] += p.count
		}
	}
	return out
}

func join(set attribute.Set, keys ...string) string {
	var parts []string
	for _, k := range keys {
		if v, ok := set.Value(attribute.Key(k)); ok {
			parts = append(parts, v.String())
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
