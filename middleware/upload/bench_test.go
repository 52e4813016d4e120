package upload_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/harness/bench"
)

// BenchmarkUpload measures an upload's claim of a slot in its user's
// window (upload.Limiter.Acquire, kept as a successful upload keeps it),
// at 1 and 16 clients beside SELECT 1, the one-row upsert and redis_rate
// Allow measured in the same run (see bench.Package).
func BenchmarkUpload(b *testing.B) { bench.Package(b, "upload claim") }
