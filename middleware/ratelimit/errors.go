package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/problem"
)

// SlugTooMany is the problem type slug of a refused request.
const SlugTooMany = "too-many-requests"

// SlugUnavailable is the problem type slug of a decision the database
// could not make (fail closed).
const SlugUnavailable = "database-unavailable"

// errLimited stands for the root package's sentinel until it is on main.
//
// TODO(api-shape): LimitError.Is matches pglimit.ErrLimited; drop this.
var errLimited = errors.New("pglimit: limit reached")

// LimitError is a refused request.
type LimitError struct {
	// Name is the limiter's name.
	Name string
	// Violated names the policies that had no room for the request, in the
	// request's order (the problem body's violated-policies).
	Violated []string
	// Limit is the first violated policy's Limit (the problem body's
	// limit).
	Limit int
	// RetryAfter is the time until the request would fit, exact to the
	// microsecond on the database clock, if nothing else is spent
	// meanwhile; 0 when it never can (its cost is above a violated
	// policy's Burst).
	RetryAfter time.Duration
	// Cost is what the request would have spent.
	Cost int
	// Policies are the request's policies and the key's state in them
	// (none when the cost is above a burst: no round trip was made).
	Policies []PolicyState
	// At is when the decision was made, on the database clock (zero when
	// no round trip was made).
	At time.Time
}

func (e *LimitError) Error() string {
	if e.RetryAfter == 0 {
		return fmt.Sprintf("ratelimit: %s: a request of cost %d can never pass policies %s (above their burst)",
			e.Name, e.Cost, strings.Join(e.Violated, ", "))
	}
	return fmt.Sprintf("ratelimit: %s: no room in policies %s; retry in %v", e.Name, strings.Join(e.Violated, ", "), e.RetryAfter)
}

// Is reports whether target is the sentinel every pglimit refusal
// matches.
func (e *LimitError) Is(target error) bool { return target == errLimited }

// isCanceled reports whether err ended a decision because the caller's
// context was canceled: a client that went away, not a failure.
//
// TODO(api-shape): pglimit.Classify(err) == pglimit.ClassCanceled.
func isCanceled(ctx context.Context, err error) bool {
	return errors.Is(err, context.Canceled) || (ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled))
}

// isUnavailable reports whether err is a database that cannot be reached
// or did not answer in time: what FailOpen covers and what is answered
// 503.
//
// TODO(api-shape): pglimit.Classify: ClassUnavailable or ClassTimeout.
func isUnavailable(err error) bool {
	return dberr.IsUnavailable(err) || dberr.IsTimeout(err)
}

// WriteError is the default Options.OnError. A *LimitError is 429
// too-many-requests with Retry-After (none when the request can never
// pass), the RateLimit headers and the members limit, retryAfter
// (seconds) and violated-policies; a database that cannot be reached or
// did not answer in time is 503 database-unavailable with Retry-After;
// a client that went away gets nothing; anything else is 500
// internal-error, without the error's text. It logs nothing: the Limiter
// logs incidents, once each.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *LimitError
	switch {
	case errors.As(err, &e):
		writeRefusal(w, r, e)
	case isCanceled(r.Context(), err):
		// Nothing useful can reach a client that went away.
	case isUnavailable(err):
		problem.Write(w, &problem.Details{
			Slug: SlugUnavailable, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
			Detail: "The database cannot be reached; try again shortly.", Instance: r.URL.Path,
			RetryAfter: 5 * time.Second,
		})
	default:
		problem.Write(w, &problem.Details{
			Slug: "internal-error", Title: "Internal server error", Status: http.StatusInternalServerError,
			Detail: "The server could not complete the request. It has been logged.", Instance: r.URL.Path,
		})
	}
}

func writeRefusal(w http.ResponseWriter, r *http.Request, e *LimitError) {
	setHeaders(w.Header(), e.Policies)
	ext := map[string]any{"limit": e.Limit, "violated-policies": e.Violated}
	d := &problem.Details{
		Slug: SlugTooMany, Title: "Too many requests", Status: http.StatusTooManyRequests,
		Instance: r.URL.Path, Extensions: ext,
	}
	if e.RetryAfter > 0 {
		retry := problem.RetryAfterSeconds(e.RetryAfter)
		d.RetryAfter = time.Duration(retry) * time.Second
		ext["retryAfter"] = retry
		d.Detail = fmt.Sprintf("The rate of policy %s is spent; retry in %d s.", strings.Join(e.Violated, ", "), retry)
	} else {
		d.Detail = fmt.Sprintf("This request costs %d, more than policy %s allows at once; it can never pass.",
			e.Cost, strings.Join(e.Violated, ", "))
	}
	problem.Write(w, d)
}
