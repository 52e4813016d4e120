package observetest

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/internal/observe"
)

// TestMeterRecords: a Meter sums a counter and counts a histogram's
// observations by attribute set, keeps apart what two meters of one
// provider record under one name only by their attributes, and records
// nothing from an instrument pglimit does not use.
func TestMeterRecords(t *testing.T) {
	m := New()
	ctx := context.Background()
	c, err := m.Meter("a").Int64Counter(observe.MetricDecisions)
	if err != nil {
		t.Fatal(err)
	}
	c2, _ := m.Meter("b").Int64Counter(observe.MetricDecisions)
	h, _ := m.Meter("a").Float64Histogram(observe.MetricDuration)
	up, _ := m.Meter("a").Int64UpDownCounter("ignored")
	if !c.Enabled(ctx) || !h.Enabled(ctx) {
		t.Error("a recording instrument says it is disabled")
	}
	admitted := metric.WithAttributes(attribute.String("limit", "api"), attribute.String("outcome", "admitted"))
	c.Add(ctx, 2, admitted)
	c2.Add(ctx, 3, admitted)
	c.Add(ctx, 1, metric.WithAttributes(attribute.String("limit", "api"), attribute.String("outcome", "refused"), attribute.String("scope", "key")))
	c.Add(ctx, 7)
	h.Record(ctx, 0.5, metric.WithAttributes(attribute.String("limit", "api"), attribute.String("op", "take")))
	h.Record(ctx, 0.7, metric.WithAttributes(attribute.String("limit", "api"), attribute.String("op", "take")))
	up.Add(ctx, 9)

	if diff := cmp.Diff(map[string]int64{"api admitted": 5, "api refused key": 1, "": 7}, m.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]uint64{"api take": 2}, m.Durations(t)); diff != "" {
		t.Errorf("durations (-want +got):\n%s", diff)
	}
	if got := m.Counts(t, "ignored"); len(got) != 0 {
		t.Errorf("an up-down counter recorded %v", got)
	}
	if n := len(m.Points()); n != 4 {
		t.Errorf("%d points, want 4: %+v", n, m.Points())
	}
}
