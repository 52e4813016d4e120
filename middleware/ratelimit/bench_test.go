package ratelimit_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/harness/bench"
)

// BenchmarkRateLimit measures a rate-limit decision under one policy and
// under two (all or nothing), at 1 and 16 clients beside SELECT 1, the
// one-row upsert and redis_rate Allow measured in the same run (see
// bench.Package).
func BenchmarkRateLimit(b *testing.B) { bench.Package(b, bench.NameRateLimit, bench.NameRateLimit2) }

// BenchmarkBannedRefusal measures a banned key's refusal (Options.Ban:
// from memory, before the rate) beside the rate's own refusal from memory
// and the floors, at 1 and 16 clients.
func BenchmarkBannedRefusal(b *testing.B) {
	bench.Package(b, bench.NameFromMemory, bench.NameBanned)
}
