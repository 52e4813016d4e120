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
// retryAfter (seconds).
//
// # Identity
//
// The key function returns the token's identity: its id or name as the
// application stores it, or TokenKey of the raw token when it has none.
// That string is written to request_in_flight (scope and holder), which
// operators can read; the raw bearer token must never be returned.
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

	"github.com/pglimit/pglimit"
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
	DefaultLimit       = 8
	DefaultMaxDuration = 2 * time.Minute
)

// Options configure a Limiter.
type Options struct {
	// Key returns the identity of the request's API token (its id or name,
	// never the raw token; see TokenKey); ok false refuses the request with
	// 401. Put the authentication middleware before this one. Required.
	Key func(*http.Request) (key string, ok bool)
	// Limit is how many requests of one token may be in flight at once,
	// across all replicas. Default 8.
	Limit int
	// MaxDuration is the longest a request may run: its handler's context
	// ends then, and its slot lapses MaxDuration + 30 s after the claim if
	// nobody releases it. Default 2 minutes.
	MaxDuration time.Duration
	// Replica names this replica on its rows. Default host:pid.
	Replica string
	// OnRefused writes the response of a refused request. Default:
	// WriteRefusal.
	OnRefused func(http.ResponseWriter, *http.Request, *LimitError)
	// Logger receives release failures. Default slog.Default().
	Logger *slog.Logger
}

// Limiter caps requests in flight per token. It is safe for concurrent use.
type Limiter struct {
	leaser    *permit.Leaser
	limit     int
	maxDur    time.Duration
	grace     time.Duration
	key       func(*http.Request) (string, bool)
	onRefused func(http.ResponseWriter, *http.Request, *LimitError)
	log       *slog.Logger
}

// New returns a Limiter keeping its slots in pool's database.
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
	if opts.Limit < 0 || opts.MaxDuration < 0 {
		return nil, errors.New("inflight: negative Limit or MaxDuration")
	}
	if opts.Limit == 0 {
		opts.Limit = DefaultLimit
	}
	if opts.Limit > pglimit.MaxLimit {
		return nil, fmt.Errorf("inflight: Limit %d above pglimit.MaxLimit (%d)", opts.Limit, pglimit.MaxLimit)
	}
	if opts.MaxDuration == 0 {
		opts.MaxDuration = DefaultMaxDuration
	}
	if opts.MaxDuration < time.Millisecond {
		return nil, errors.New("inflight: MaxDuration below a millisecond")
	}
	if opts.OnRefused == nil {
		opts.OnRefused = WriteRefusal
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	leaser, err := permit.New(pool, permit.Options{Kind: permit.RequestInFlight, Replica: opts.Replica})
	if err != nil {
		return nil, err
	}
	return &Limiter{leaser: leaser, limit: opts.Limit, maxDur: opts.MaxDuration, grace: grace, key: opts.Key,
		onRefused: opts.OnRefused, log: opts.Logger}, nil
}

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
	lease *permit.Lease
}

// Release frees the slot, in one statement. It outlives a canceled ctx.
func (p *Permit) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.lease.Release(ctx)
}

// Acquire claims a slot of key, for callers that are not HTTP handlers. It
// returns a *LimitError when key has Limit requests in flight. Release the
// permit when the work ends, and end the work within MaxDuration.
func (l *Limiter) Acquire(ctx context.Context, key, endpoint string) (*Permit, error) {
	if key == "" {
		return nil, errors.New("inflight: empty key")
	}
	lease, err := l.leaser.Claim(ctx, permit.Claim{
		Scopes: []permit.Scope{{Key: Scope(key), Cap: l.limit}},
		Holder: key, Endpoint: storable(endpoint), Lease: l.maxDur + l.grace,
	})
	if err != nil {
		var refused *permit.RefusedError
		if errors.As(err, &refused) {
			return nil, &LimitError{Limit: l.limit, RetryAfter: max(time.Second, refused.FirstLapse-l.grace)}
		}
		return nil, err
	}
	return &Permit{lease: lease}, nil
}

// Handler caps the requests to next in flight per token: it claims a slot
// (429 when the token has none free), runs next with its context ending at
// MaxDuration, and releases the slot when next returns, panics, or the
// client goes away.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := l.key(r)
		if !ok || key == "" {
			problem.Write(w, &problem.Details{Slug: "unauthorized", Title: "Unauthorized", Status: http.StatusUnauthorized,
				Detail: "This endpoint needs an API token."})
			return
		}
		p, err := l.Acquire(r.Context(), key, endpointOf(r))
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				l.onRefused(w, r, le)
			} else {
				respond.Log(r.Context(), l.log, "inflight: claim failed", err)
				respond.Database(w, r, err)
			}
			return
		}
		defer func() {
			if err := p.Release(r.Context()); err != nil {
				l.log.WarnContext(r.Context(), "inflight: release failed; the slot lapses on its own", "key", key, "err", err)
			}
		}()
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

// WriteRefusal is the default refusal: 429 problem+json
// too-many-requests-in-flight with Retry-After and the members limit and
// retryAfter (seconds).
func WriteRefusal(w http.ResponseWriter, r *http.Request, e *LimitError) {
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
