// Package retryafter rounds a wait the way every pglimit refusal states
// it: in whole seconds, rounded up, at least 1. The Retry-After header
// (package problem) and the retryAfter member and RateLimit t= of each
// limiter's refusal use it, so the three never disagree.
package retryafter

import (
	"math"
	"time"
)

// Seconds rounds d up to whole seconds, at least 1.
func Seconds(d time.Duration) int {
	s := int(math.Ceil(d.Seconds()))
	if s < 1 {
		s = 1
	}
	return s
}
