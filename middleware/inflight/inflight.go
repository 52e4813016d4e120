// Package inflight caps the requests an API token has in flight at once,
// across every replica of a service (ADR-0196 decision 5).
//
// It is built on permit.Leaser over the UNLOGGED request_in_flight table:
// a request claims one of its token's Limit slots before its handler runs
// and releases it, in one statement, when the handler returns, panics or
// the client goes away. A slot is leased for MaxDuration + 30 s, so the
// slots of a replica that died lapse on their own; the handler's context
// ends at MaxDuration, so a live request never outlives its lease unless
// it ignores its context. A refused request gets 429
// too-many-requests-in-flight with Retry-After and the members limit and
// retryAfter (seconds). Acquire takes a slot without HTTP.
//
//	capper, err := inflight.New(pool, inflight.Options{Key: tokenIDOf, Limit: 8})
//	api := capper.Handler(mux)
//
// # Identity
//
// The key function returns the token's identity: its id or name as the
// application stores it, or TokenKey of the raw token when it has none.
// That string is written to request_in_flight (scope and holder), which
// operators can read; the raw bearer token must never be returned.
//
// # Unidentified requests
//
// A request whose key Options.Key cannot read (ok false, or an empty key)
// passes to next as it is: no slot, no MaxDuration. A limiter is not an
// authenticator. So the Handler can wrap a whole mux: the sign-in route,
// which has no token yet, reaches its own handler (and its sign-in
// throttle), while every request with a token is counted.
//
// # Responses
//
// Every response the Handler writes itself goes through Options.OnError,
// WriteError by default: a refusal (*LimitError, 429), a database that
// cannot be reached or did not answer within Options.Timeout (503
// database-unavailable), anything else (500, logged through
// Options.Logger, never sent). A client that went away gets nothing.
//
// A Limiter is safe for concurrent use.
package inflight

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/respond"
	"github.com/pglimit/pglimit/permit"
	"github.com/pglimit/pglimit/problem"
)

// SlugTooMany is the problem type slug of a refused request.
const SlugTooMany = "too-many-requests-in-flight"

// Grace is added to MaxDuration to make a slot's lease: a slot whose
// holder vanished lapses MaxDuration + Grace after it was claimed.
const Grace = 30 * time.Second

// Defaults of Options.
const (
	DefaultName        = "in-flight"
	DefaultLimit       = 8
	DefaultMaxDuration = 2 * time.Minute
	DefaultTimeout     = 5 * time.Second
)

// Options configure a Limiter.
type Options struct {
	// Name is the limit's name, in log lines and on the slots of Acquire.
	// Default "in-flight".
	Name string
	// Key returns the identity of the request's API token (its id or name,
	// never the raw token; see TokenKey). ok false, or an empty key, lets
	// the request pass to next uncounted (see Unidentified requests): put
	// the authentication before this middleware, or let the handler refuse
	// it. Required.
	Key func(*http.Request) (key string, ok bool)
	// Limit is how many requests of one token may be in flight at once,
	// across all replicas: 1..pglimit.MaxLimit. Default 8.
	Limit int
	// MaxDuration is the longest a request may run: its handler's context
	// ends then, and its slot lapses MaxDuration + 30 s after the claim if
	// nobody releases it. Default 2 minutes.
	MaxDuration time.Duration
	// Timeout bounds the database work of one claim or one release when
	// the caller's context has no sooner deadline, so a database that hangs
	// fails the request (503) instead of hanging it. Default 5s.
	Timeout time.Duration
	// Replica names this replica on its rows. Default host:pid.
	Replica string
	// OnError writes every response the Handler writes itself: a refusal
	// (*LimitError) and a failed claim. The Handler has logged a failure
	// that is not a refusal before it calls OnError. Default: WriteError.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Logger receives failed claims and releases, and in dry run the
	// requests it would have refused. Default slog.Default(), taken when
	// New runs.
	Logger *slog.Logger
	// MeterProvider gives the meter of the metrics pglimit.decisions
	// (attributes limit = Name, outcome, scope token) and
	// pglimit.decision.duration (op claim, release). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// DryRun decides as usual but refuses nobody: a request that would
	// have been refused runs without a slot (the token's are all taken),
	// is counted with outcome dry-run-refused and logged (at most a line a
	// second). Granted requests take and release their slots as usual, so
	// what is held, and so every later decision, is what it would be with
	// the limit on. Default false.
	DryRun bool
}

// scopeToken is the kind of scope of every decision (attribute scope).
const scopeToken = "token"

// Limiter caps requests in flight per token. It is safe for concurrent use.
type Limiter struct {
	leaser  *permit.Leaser
	name    string
	limit   int
	maxDur  time.Duration
	grace   time.Duration
	timeout time.Duration
	key     func(*http.Request) (string, bool)
	onError func(http.ResponseWriter, *http.Request, error)
	log     *slog.Logger
	obs     *observe.Limit
}

// New returns a Limiter keeping its slots in pool's database. It checks
// opts and starts nothing.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	return newLimiter(pool, opts, Grace)
}

func newLimiter(pool *pgxpool.Pool, opts Options, grace time.Duration) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("inflight: nil pool")
	}
	if opts.Key == nil {
		return nil, errors.New("inflight: Options.Key is required")
	}
	if opts.Name == "" {
		opts.Name = DefaultName
	}
	if opts.Limit == 0 {
		opts.Limit = DefaultLimit
	}
	if opts.Limit < 1 || opts.Limit > pglimit.MaxLimit {
		return nil, fmt.Errorf("inflight: Limit %d outside 1..pglimit.MaxLimit (%d)", opts.Limit, pglimit.MaxLimit)
	}
	if opts.MaxDuration == 0 {
		opts.MaxDuration = DefaultMaxDuration
	}
	if opts.MaxDuration < time.Millisecond {
		return nil, fmt.Errorf("inflight: MaxDuration %v below a millisecond", opts.MaxDuration)
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Timeout < 0 {
		return nil, errors.New("inflight: negative Timeout")
	}
	if opts.OnError == nil {
		opts.OnError = WriteError
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	obs, err := observe.New(observe.Options{Name: opts.Name, Scopes: []string{scopeToken}, DryRun: opts.DryRun,
		MeterProvider: opts.MeterProvider, Logger: opts.Logger, DB: pool, Timeout: opts.Timeout})
	if err != nil {
		return nil, fmt.Errorf("inflight: %w", err)
	}
	leaser, err := permit.New(pool, permit.Options{Kind: permit.RequestInFlight, Replica: opts.Replica, Timeout: opts.Timeout,
		Logger: opts.Logger, OnRelease: obs.Released})
	if err != nil {
		return nil, err
	}
	return &Limiter{leaser: leaser, name: opts.Name, limit: opts.Limit, maxDur: opts.MaxDuration, grace: grace,
		timeout: opts.Timeout, key: opts.Key, onError: opts.OnError, log: opts.Logger, obs: obs}, nil
}

// Name is the limit's name.
func (l *Limiter) Name() string { return l.name }

// Limit is the number of requests a token may have in flight.
func (l *Limiter) Limit() int { return l.limit }

// MaxDuration is the longest a request may run.
func (l *Limiter) MaxDuration() time.Duration { return l.maxDur }

// Scope is the scope key of key's slots in request_in_flight.
func Scope(key string) string { return permit.ScopeKey("token", key) }

// TokenKey is an identity for a raw token that has no id of its own: the
// first 16 bytes of its SHA-256, in hex. It is safe to store; the token is
// not. Use it only for tokens with enough entropy to resist guessing (a
// random API token does; a password would not).
func TokenKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// LimitError is a refused request.
type LimitError struct {
	// Name is the limit's name (Options.Name).
	Name string
	// Limit is the number of requests a token may have in flight.
	Limit int
	// RetryAfter is when the oldest request in flight reaches its maximum
	// duration, at least one second: by then a slot is free (most free far
	// sooner, when their request ends).
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("inflight: %d requests in flight already; retry in %v", e.Limit, e.RetryAfter)
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == pglimit.ErrLimited }

// Permit is one request in flight.
type Permit struct {
	lease   *permit.Lease // nil for a dry-run refusal
	refusal *LimitError
}

// Refusal is, in dry run, the refusal this request would have had: it
// holds no slot. Nil when the request fits.
func (p *Permit) Refusal() *LimitError { return p.refusal }

// Release frees the slot and waits until the database has it back, or ctx
// ends (permit.Lease.Release): a request answered after it never holds its
// slot on any replica. The release leaves at once, in the Limiter's next
// round trip, shared with the claims and releases made meanwhile. One that
// fails is logged, and the slot then lapses on its own at MaxDuration +
// 30 s after the claim, as it does when the process is killed before the
// release is sent; one whose ctx ended goes on without the caller
// (Limiter.Flush waits for it). It is safe to call more than once.
func (p *Permit) Release(ctx context.Context) error {
	if p == nil || p.lease == nil {
		return nil
	}
	return p.lease.Release(ctx)
}

// releaseWithin is the Handler's release: Release waiting permit.AnswerWait
// at most.
func (p *Permit) releaseWithin(ctx context.Context) {
	if p != nil && p.lease != nil {
		_ = p.lease.ReleaseWithin(ctx, permit.AnswerWait)
	}
}

// Flush waits until every slot released so far has reached the database
// (see permit.Leaser.Flush). Call it at shutdown, after the server stopped
// serving (http.Server.Shutdown returned), so that no release is lost with
// the process.
func (l *Limiter) Flush(ctx context.Context) error { return l.leaser.Flush(ctx) }

// Acquire claims a slot of key, for callers that are not HTTP handlers. It
// returns a *LimitError (errors.Is pglimit.ErrLimited) when key has Limit
// requests in flight — in dry run a Permit without a slot instead, whose
// Refusal says so; any other error is the database's
// (pglimit.Classify) or ctx's. Release the permit when the work ends, and
// end the work within MaxDuration.
func (l *Limiter) Acquire(ctx context.Context, key string) (*Permit, error) {
	return l.acquire(ctx, key, l.name)
}

func (l *Limiter) acquire(ctx context.Context, key, endpoint string) (*Permit, error) {
	if key == "" {
		return nil, errors.New("inflight: empty key")
	}
	start := time.Now()
	lease, err := l.leaser.Claim(ctx, permit.Claim{
		Scopes: []permit.Scope{{Key: Scope(key), Cap: l.limit}},
		Holder: key, Endpoint: storable(endpoint), Lease: l.maxDur + l.grace,
	})
	l.obs.Took(ctx, observe.Claim, start)
	if err != nil {
		var refused *permit.RefusedError
		if !errors.As(err, &refused) {
			l.obs.Failed(ctx, scopeToken, err)
			return nil, err
		}
		le := &LimitError{Name: l.name, Limit: l.limit, RetryAfter: max(time.Second, refused.FirstLapse-l.grace)}
		if !l.obs.Refused(ctx, scopeToken, key, "cap", l.limit, "endpoint", endpoint) {
			return nil, le
		}
		return &Permit{refusal: le}, nil
	}
	l.obs.Granted(ctx, scopeToken)
	return &Permit{lease: lease}, nil
}

// Handler caps the requests to next in flight per token: it claims a slot
// (429 when the token has none free), runs next with its context ending at
// MaxDuration, and releases the slot when next returns, panics, or the
// client goes away, before the answer completes (see Permit.Release). An unidentified request passes to next as it
// is.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := l.key(r)
		if !ok || key == "" {
			next.ServeHTTP(w, r)
			return
		}
		p, err := l.acquire(r.Context(), key, endpointOf(r))
		if err != nil {
			if !errors.Is(err, pglimit.ErrLimited) {
				respond.Log(r.Context(), l.log, "inflight: claim failed", err, "limit", l.name)
			}
			l.onError(w, r, err)
			return
		}
		// The answer completes once the slot is back (permit.AnswerWait at
		// most); a failed release is logged by the Leaser.
		defer p.releaseWithin(r.Context())
		ctx, cancel := context.WithTimeout(r.Context(), l.maxDur)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// endpointOf names a request on its slot, for operators: the pattern the
// ServeMux matched ("GET /api/nodes/{node}/queues"), which holds no client
// text, or else the method and the path.
func endpointOf(r *http.Request) string {
	if r.Pattern != "" {
		return r.Pattern
	}
	return r.Method + " " + r.URL.Path
}

// maxEndpointLen bounds the endpoint text stored on a slot.
const maxEndpointLen = 200

// storable makes an endpoint text the database stores whatever a client put
// in the path: valid UTF-8 without NUL (PostgreSQL text refuses both), at
// most maxEndpointLen bytes.
func storable(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) > maxEndpointLen {
		s = strings.ToValidUTF8(s[:maxEndpointLen], "")
	}
	return s
}

// WriteError answers a failed request; it is the default Options.OnError:
//
//   - *LimitError: 429 too-many-requests-in-flight with Retry-After and the
//     members limit and retryAfter (seconds);
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     database-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: the Handler logs before it calls OnError.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *LimitError
	if !errors.As(err, &e) {
		respond.Database(w, r, err)
		return
	}
	retry := problem.RetryAfterSeconds(e.RetryAfter)
	problem.Write(w, &problem.Details{
		Slug:       SlugTooMany,
		Title:      "Too many requests in flight",
		Status:     http.StatusTooManyRequests,
		Detail:     fmt.Sprintf("This token already has %d requests in flight, its limit; retry when one ends.", e.Limit),
		Instance:   r.URL.Path,
		RetryAfter: time.Duration(retry) * time.Second,
		Extensions: map[string]any{"limit": e.Limit, "retryAfter": retry},
	})
}
