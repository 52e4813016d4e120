package ratelimit

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pglimit/pglimit/internal/retryafter"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/problem"
	engine "github.com/pglimit/pglimit/ratelimit"
)

// slugTooMany is the problem type slug of a refused request, slugBanned
// that of a banned key's.
const (
	slugTooMany = "too-many-requests"
	slugBanned  = "banned"
)

// writeBanned writes a banned key's refusal (e.Banned): 429 banned with
// Retry-After and the member retryAfter (seconds, rounded up).
func writeBanned(w http.ResponseWriter, r *http.Request, e *engine.LimitError) {
	retry := retryafter.Seconds(e.RetryAfter)
	problem.Write(w, &problem.Details{
		Slug: slugBanned, Title: "Banned", Status: http.StatusTooManyRequests, Instance: r.URL.Path,
		Detail:     fmt.Sprintf("Too many requests were refused; this client is refused for %d s.", retry),
		RetryAfter: time.Duration(retry) * time.Second, Extensions: map[string]any{"retryAfter": retry},
	})
}

// WriteError is the default Options.OnError. An *engine.LimitError is 429
// too-many-requests with Retry-After (none when the request can never
// pass), the RateLimit headers and the members limit, retryAfter
// (seconds) and violated-policies; a banned key's (Banned) is 429 banned
// with Retry-After and the member retryAfter; a database that cannot be
// reached or did not answer in time (pglimit.Classify) is 503
// database-unavailable with Retry-After; a client that went away gets nothing; anything else is
// 500 internal-error, without the error's text. It logs nothing: the
// Limiter logs incidents, once each.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *engine.LimitError
	if errors.As(err, &e) {
		writeRefusal(w, r, e)
		return
	}
	respond.Database(w, r, err)
}

func writeRefusal(w http.ResponseWriter, r *http.Request, e *engine.LimitError) {
	if e.Banned {
		writeBanned(w, r, e)
		return
	}
	SetHeaders(w.Header(), e.Policies)
	ext := map[string]any{"limit": e.Limit, "violated-policies": e.Violated}
	d := &problem.Details{
		Slug: slugTooMany, Title: "Too many requests", Status: http.StatusTooManyRequests,
		Instance: r.URL.Path, Extensions: ext,
	}
	if e.RetryAfter > 0 {
		retry := retryafter.Seconds(e.RetryAfter)
		d.RetryAfter = time.Duration(retry) * time.Second
		ext["retryAfter"] = retry
		d.Detail = fmt.Sprintf("The rate of policy %s is spent; retry in %d s.", strings.Join(e.Violated, ", "), retry)
	} else {
		d.Detail = fmt.Sprintf("This request costs %d, more than policy %s allows at once; it can never pass.",
			e.Cost, strings.Join(e.Violated, ", "))
	}
	problem.Write(w, d)
}
