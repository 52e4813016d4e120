package inflight_test

import (
	"testing"

	"github.com/pglimit/pglimit/harness/bench"
)

// BenchmarkInFlight measures a token's in-flight slot, claimed and
// released (inflight.Limiter.Acquire + Permit.Release), at 1 and 16
// clients beside SELECT 1, the one-row upsert and redis_rate Allow
// measured in the same run (see bench.Package).
func BenchmarkInFlight(b *testing.B) { bench.Package(b, "in-flight claim+release") }
