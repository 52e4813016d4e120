// Package ratelimit is the HTTP face of a rate limit (package
// github.com/pglimit/pglimit/ratelimit, the engine): it takes each
// request's key, policies and cost, asks the engine's Limiter, answers the
// RateLimit headers on every request it counted, and refuses a request
// past the rate with 429 too-many-requests. It decides nothing itself.
//
//	limiter, err := ratelimit.New(pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "api", Limit: 100, Window: time.Second}}})
//	mw, err := mratelimit.New(mratelimit.Options{Limiter: limiter, Key: tokenID})
//	mux.Handle("/api/", mw.Handler(api))
//
// # Responses
//
// Every response that passed the limiter carries the RateLimit-Policy and
// RateLimit headers of draft-ietf-httpapi-ratelimit-headers-11 (structured
// field lists, RFC 9651), one item per policy:
//
//	RateLimit-Policy: "api";q=100;w=1;pglimit-burst=200
//	RateLimit: "api";r=163;t=1
//
// q and w are the policy's Limit and Window (seconds), pglimit-burst its
// Burst when it differs from Limit, r the units the key may spend now and
// t the seconds until one more unit is available (0: none are spent). No
// partition key is sent: a key is the client's identity and is never
// written to a response. A refused request is 429 problem+json of type
// ...:too-many-requests with the members limit (the first violated
// policy's Limit), retryAfter (seconds) and violated-policies (draft-11's
// member: the names of the policies that refused it), the same headers,
// and Retry-After: the whole seconds, rounded up, until the request would
// fit. A banned key (the engine's Options.Ban) is 429 banned with
// Retry-After.
//
// # Failures
//
// When the database cannot decide, the request is refused with 503
// database-unavailable and Retry-After, or, with the engine's
// Options.FailOpen, let through uncounted and without headers; a client
// that went away gets nothing.
//
// A Middleware is safe for concurrent use.
package ratelimit

import (
	"errors"
	"log/slog"
	"net/http"

	engine "github.com/pglimit/pglimit/ratelimit"

	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/vocab"
)

// Options configure a Middleware. Limiter and Key are required.
type Options struct {
	// Limiter decides. Required.
	Limiter *engine.Limiter
	// Key returns the identity a request is counted against (a token's
	// id, a user, a tenant; never a raw secret: it is stored, and logged
	// in dry run). ok false, or an empty key, lets the request through
	// uncounted and without headers: a limiter is not an authenticator.
	// Required.
	Key func(*http.Request) (key string, ok bool)
	// PolicyFunc, when set, gives the policies of each request (by the
	// caller's plan or tenant, read per request, so limits change without
	// a restart); nil or none lets the request through uncounted. Its
	// policies are checked per request: an invalid one fails the request
	// (500, logged) with an error matching engine.ErrInvalidPolicy.
	// Default: none (the Limiter's Options.Policies for every request,
	// which must then have one).
	PolicyFunc func(r *http.Request, key string) []engine.Policy
	// Exempt, when set, lets a request for which it returns true through
	// uncounted, spending nothing, without headers and without a
	// statement, counted in pglimit.decisions with outcome "exempt": the
	// allow list's exemption (middleware/rules.Allowed). It runs before
	// Key. Default: none is exempt.
	Exempt func(*http.Request) bool
	// Cost returns the units a request spends (at least 0; 0 reads the
	// state without spending). A request costing more than a policy's
	// Burst can never pass it and is refused without a database round
	// trip, with no Retry-After. Default: 1 per request.
	Cost func(*http.Request) int
	// OnError writes every response the middleware writes itself: a
	// refusal (*engine.LimitError), a database that cannot be reached or
	// timed out, an invalid policy. Default WriteError.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Logger receives what PolicyFunc or Cost gave that cannot be used.
	// Default slog.Default() (taken at New).
	Logger *slog.Logger
}

// Middleware limits the rate of HTTP requests through its Limiter.
type Middleware struct {
	o      Options
	errLog observe.Sampled
}

// New checks o once and returns a Middleware.
func New(o Options) (*Middleware, error) {
	if o.Limiter == nil {
		return nil, errors.New("ratelimit: Options.Limiter is required")
	}
	if o.Key == nil {
		return nil, errors.New("ratelimit: Options.Key is required")
	}
	if o.PolicyFunc == nil && len(o.Limiter.Policies()) == 0 {
		return nil, errors.New("ratelimit: Options.PolicyFunc is required when the Limiter has no Policies")
	}
	if o.OnError == nil {
		o.OnError = WriteError
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	return &Middleware{o: o}, nil
}

// Handler limits the rate of requests to next. A request whose key or
// policies are none passes uncounted; an admitted one passes with the
// RateLimit headers; a refused one gets OnError's answer (429 by
// default). When the decision fails, it is refused (503), or, with the
// engine's Options.FailOpen, passes uncounted without headers. A
// request Options.Exempt exempts passes uncounted, without headers.
func (m *Middleware) Handler(next http.Handler) http.Handler {
	l := m.o.Limiter
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.o.Exempt != nil && m.o.Exempt(r) {
			l.Exempted(r.Context())
			next.ServeHTTP(w, r)
			return
		}
		key, ok := m.o.Key(r)
		if !ok || key == "" {
			next.ServeHTTP(w, r)
			return
		}
		var policies []engine.Policy
		if m.o.PolicyFunc != nil {
			policies = m.o.PolicyFunc(r, key)
			if len(policies) == 0 {
				next.ServeHTTP(w, r)
				return
			}
		}
		cost := 1
		if m.o.Cost != nil {
			cost = m.o.Cost(r)
		}
		p, err := l.AcquireN(r.Context(), key, cost, policies)
		if err != nil {
			switch {
			case errors.Is(err, engine.ErrInvalidPolicy), errors.Is(err, vocab.ErrInvalidCost):
				m.errLog.Log(r.Context(), m.o.Logger, slog.LevelError, "ratelimit: Options.PolicyFunc or Options.Cost gave what cannot be used",
					"limit", l.Name(), "err", err)
			}
			m.o.OnError(w, r, err)
			return
		}
		SetHeaders(w.Header(), p.Policies)
		next.ServeHTTP(w, r)
	})
}
