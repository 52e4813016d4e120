// Package quota is the HTTP face of a calendar quota (package
// github.com/pglimit/pglimit/quota): it charges each request to its key
// before the handler runs, answers the IETF RateLimit-Policy and RateLimit
// headers on every answer it counted — the reset being the period's end —
// and refuses a request past the quota with 429 quota-exhausted. It
// decides nothing itself: the Limiter does, in one statement.
//
// How it fails: a database that cannot decide is 503 database-unavailable
// with Retry-After, never a 500 and never a pass; a client that went away
// gets nothing.
package quota

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/pglimit/pglimit/internal/retryafter"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/middleware/internal/sfv"
	"github.com/pglimit/pglimit/problem"
	engine "github.com/pglimit/pglimit/quota"
)

// slugExhausted is the problem type slug of a refusal.
const slugExhausted = "quota-exhausted"

// Options configure a Middleware.
type Options struct {
	// Limiter is the quota the requests are charged to. Required.
	Limiter *engine.Limiter
	// Policy names the quota in the RateLimit headers and in the problem
	// body's policy member: a token ([a-z0-9-], 1 to 64 bytes). Required.
	Policy string
	// Key returns the request's key; false (or "") lets the request pass
	// uncounted. Required.
	Key func(*http.Request) (string, bool)
	// Cost returns what the request costs, 0 to engine.MaxLimit. Default 1.
	Cost func(*http.Request) int64
	// OnError answers a refusal or a failed decision. Default WriteError.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Logger receives failed decisions. Default slog.Default().
	Logger *slog.Logger
}

// Middleware charges requests to a quota. It is safe for concurrent use.
type Middleware struct {
	o Options
}

// New checks o once and returns a Middleware.
func New(o Options) (*Middleware, error) {
	if o.Limiter == nil {
		return nil, errors.New("quota: nil Limiter")
	}
	if o.Key == nil {
		return nil, errors.New("quota: nil Key")
	}
	if !validPolicy(o.Policy) {
		return nil, fmt.Errorf("quota: Policy %q must be 1 to 64 bytes of a-z, 0-9 and -", o.Policy)
	}
	if o.Cost == nil {
		o.Cost = func(*http.Request) int64 { return 1 }
	}
	if o.OnError == nil {
		o.OnError = WriteError
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Middleware{o: o}, nil
}

func validPolicy(p string) bool {
	if p == "" || len(p) > 64 {
		return false
	}
	for i := 0; i < len(p); i++ {
		c := p[i]
		if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
			return false
		}
	}
	return true
}

// Handler charges every request to next with a key to its quota before
// next runs. An admitted request carries the RateLimit headers of the
// key's state after the charge; a refused one is answered by OnError and
// never reaches next.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := m.o.Key(r)
		if !ok || key == "" {
			next.ServeHTTP(w, r)
			return
		}
		p, err := m.o.Limiter.AcquireN(r.Context(), key, m.o.Cost(r))
		if err != nil {
			var le *engine.LimitError
			if !errors.As(err, &le) {
				respond.Log(r.Context(), m.o.Logger, "quota decision failed", err, "policy", m.o.Policy)
			} else {
				le.Name = m.o.Policy
			}
			m.o.OnError(w, r, err)
			return
		}
		SetHeaders(w.Header(), m.o.Policy, p.State)
		next.ServeHTTP(w, r)
	})
}

// SetHeaders adds RateLimit-Policy (q the Limit, w the period in seconds)
// and RateLimit (r the remaining units, t the seconds to the period's
// end) of policy in state s, as draft-ietf-httpapi-ratelimit-headers-11
// lists; middleware/ratelimit writes its policies the same way. For a
// quota charged outside Handler (a charge in the caller's transaction, an
// estimate settled after the work).
func SetHeaders(h http.Header, policy string, s engine.State) {
	var pol, lim strings.Builder
	sfv.String(&pol, policy)
	sfv.Param(&pol, "q", s.Limit)
	sfv.Param(&pol, "w", int64(math.Ceil(s.Reset.Sub(s.PeriodStart).Seconds())))
	sfv.String(&lim, policy)
	sfv.Param(&lim, "r", s.Remaining)
	at := s.At
	if at.IsZero() {
		at = time.Now()
	}
	sfv.Param(&lim, "t", int64(math.Ceil(max(s.Reset.Sub(at), 0).Seconds())))
	h.Add("RateLimit-Policy", pol.String())
	h.Add("RateLimit", lim.String())
}

// WriteError answers err, a charge that failed:
//
//   - *engine.LimitError: 429 quota-exhausted with the RateLimit headers
//     (policy its Name), Retry-After to the period's end and the members
//     policy, limit and retryAfter (seconds); a cost above the Limit,
//     which never fits, has no Retry-After;
//   - a client that went away: nothing;
//   - an invalid cost: 500 internal-error (a defect of the caller);
//   - anything else — the database could not decide: 503
//     database-unavailable with Retry-After, never a 500.
//
// It logs nothing.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *engine.LimitError
	if errors.As(err, &e) {
		writeRefusal(w, r, e)
		return
	}
	switch {
	case respond.Class(r.Context(), err) == vocab.ClassCanceled:
	case errors.Is(err, vocab.ErrInvalidCost):
		problem.Internal(w, r)
	default:
		respond.Unavailable(w, r, respond.SlugUnavailable, respond.DetailUnavailable)
	}
}

func writeRefusal(w http.ResponseWriter, r *http.Request, e *engine.LimitError) {
	ext := map[string]any{"policy": e.Name, "limit": e.Limit}
	d := &problem.Details{
		Slug: slugExhausted, Title: "Quota exhausted", Status: http.StatusTooManyRequests,
		Instance: r.URL.Path, Extensions: ext,
	}
	if !e.State.Reset.IsZero() {
		SetHeaders(w.Header(), e.Name, e.State)
	}
	if e.RetryAfter > 0 {
		retry := retryafter.Seconds(e.RetryAfter)
		d.RetryAfter = time.Duration(retry) * time.Second
		ext["retryAfter"] = retry
		d.Detail = fmt.Sprintf("The quota %s of %d is used up for this period; it starts again in %d s.", e.Name, e.Limit, retry)
	} else {
		d.Detail = fmt.Sprintf("This request costs %d, more than the quota %s of %d allows in a period; it can never pass.", e.Cost, e.Name, e.Limit)
	}
	problem.Write(w, d)
}
