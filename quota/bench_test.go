package quota_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/harness/bench"
)

// BenchmarkQuota runs the calendar quota's paths beside the baselines of
// the same run (internal/harness/bench): its charge beside the one-row upsert and
// the rate decision, a charge settled after the fact, and the charge in
// the caller's transaction beside a logged one-row upsert in a
// transaction.
func BenchmarkQuota(b *testing.B) {
	bench.Package(b, bench.NameQuota, bench.NameQuotaSettle, bench.NameQuotaTx, bench.NameRateLimit)
}
