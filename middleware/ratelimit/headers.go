package ratelimit

import (
	"math"
	"net/http"
	"strings"

	"github.com/pglimit/pglimit/middleware/internal/sfv"
	engine "github.com/pglimit/pglimit/ratelimit"
)

// Header names of draft-ietf-httpapi-ratelimit-headers-11.
const (
	headerPolicy    = "RateLimit-Policy"
	headerRateLimit = "RateLimit"
)

// burstParameter is the RateLimit-Policy parameter that carries a
// policy's Burst when it differs from its Limit (draft-11 asks
// implementation-specific parameters to carry a vendor prefix).
const burstParameter = "pglimit-burst"

// SetHeaders adds RateLimit-Policy and RateLimit for the policies' states
// of a decision (a Permit's or a LimitError's Policies), one list member
// per policy, as RFC 9651 structured-field lists; added, not set, so a
// response limited by several limiters lists them all. It adds nothing
// for no states. For a decision made outside Handler (AcquireN in a
// handler of its own).
func SetHeaders(h http.Header, states []engine.PolicyState) {
	if len(states) == 0 {
		return
	}
	var policy, limit strings.Builder
	for i, s := range states {
		if i > 0 {
			policy.WriteString(", ")
			limit.WriteString(", ")
		}
		writeString(&policy, s.Name)
		writeParam(&policy, "q", int64(s.Limit))
		writeParam(&policy, "w", int64(s.Window.Seconds()))
		if b := s.Burst; b != 0 && b != s.Limit { // 0 is Limit
			writeParam(&policy, burstParameter, int64(b))
		}
		writeString(&limit, s.Name)
		writeParam(&limit, "r", int64(s.Remaining))
		writeParam(&limit, "t", int64(math.Ceil(s.Reset.Seconds())))
	}
	// Added, not set: the fields are lists that may span several field
	// lines, so a response limited by several limiters (nested, or a
	// refusal written by another limit behind this one) lists them all.
	h.Add(headerPolicy, policy.String())
	h.Add(headerRateLimit, limit.String())
}

// writeString writes s as an sf-string (middleware/internal/sfv).
func writeString(b *strings.Builder, s string) { sfv.String(b, s) }

// writeParam writes ;key=n, n an sf-integer (middleware/internal/sfv).
func writeParam(b *strings.Builder, key string, n int64) { sfv.Param(b, key, n) }
