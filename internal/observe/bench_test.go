package observe_test

import (
	"context"
	"testing"
	"time"

	"go.opentelemetry.io/otel/metric/noop"

	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/observe"
)

// BenchmarkDecision is what observing a granted decision adds (one Took
// and one Granted), with no meter and with the SDK's, beside the floor of
// the database work it observes: one SELECT 1 on the same pool.
func BenchmarkDecision(b *testing.B) {
	ctx := context.Background()
	pool, _ := pgtest.NewDB(b, 2)
	b.Run("baseline SELECT 1", func(b *testing.B) {
		for b.Loop() {
			if _, err := pool.Exec(ctx, "SELECT 1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, mp := range []struct {
		name string
		opts observe.Options
	}{
		{"noop meter", observe.Options{Name: "api", Scopes: []string{"key"}, MeterProvider: noop.NewMeterProvider()}},
		{"recording meter", observe.Options{Name: "api", Scopes: []string{"key"}, MeterProvider: observetest.New()}},
	} {
		l, err := observe.New(mp.opts)
		if err != nil {
			b.Fatal(err)
		}
		b.Run(mp.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				start := time.Now()
				l.Took(ctx, observe.Check, start)
				l.Granted(ctx, "key")
			}
		})
	}
}
