// Package heavy bounds expensive endpoints across every replica of a
// service (ADR-0196 decisions 1 and 2).
//
// Each heavy endpoint is declared as an Endpoint with three bounds: a
// per-user concurrency cap, a time bound and a row cap. A request claims a
// permit in its user's scope of the endpoint and one in the installation's
// scope, which caps all heavy requests of all replicas together (by default
// at a quarter of the connection pool, at least one, so heavy requests never
// take every connection from ordinary ones). Both permits are rows of the
// UNLOGGED heavy_permit table, claimed in one round trip and released in
// one when the request ends, however it ends; a replica that dies holds
// them until the time bound plus 30 s.
//
// A refused request gets 429 too-many-heavy-requests naming the endpoint,
// the limit and whether it was the user's own or the installation's, with
// Retry-After and the IETF RateLimit-Policy / RateLimit headers. The
// handler's context carries the deadline of the time bound; Read runs a
// bounded read with statement_timeout set to what is left of it, and Stream
// copies rows until the row cap or the time bound and ends the output with a
// mark saying which stopped it.
package heavy

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/respond"
	"github.com/pglimit/pglimit/permit"
	"github.com/pglimit/pglimit/problem"
)

// Grace is added to an endpoint's time bound to make its permits' lease: a
// permit whose holder never released it lapses at bound + Grace.
const Grace = 30 * time.Second

// Problem type slugs of heavy refusals.
const (
	SlugTooMany  = "too-many-heavy-requests"
	SlugTimedOut = "heavy-request-timed-out"
)

// Scope says whose limit refused a request.
type Scope string

const (
	// ScopeUser is the user's own cap on one endpoint.
	ScopeUser Scope = "user"
	// ScopeInstallation is the cap over all heavy requests of all replicas.
	ScopeInstallation Scope = "installation"
)

// Endpoint is a heavy endpoint, declared by the code that serves it.
type Endpoint struct {
	// Name identifies the endpoint in permits and refusals, e.g.
	// "sql-console". Required.
	Name string
	// PerUser is how many requests of one user may run at once, across all
	// replicas. Default 1.
	PerUser int
	// Time bounds a request: its context ends Time after the permit is
	// granted, and database work runs with statement_timeout set to what is
	// left. Default 30s.
	Time time.Duration
	// Rows caps the rows a request may return; 0 means no cap.
	Rows int
}

func (e Endpoint) withDefaults() (Endpoint, error) {
	if e.Name == "" {
		return e, errors.New("heavy: endpoint without a name")
	}
	if e.PerUser == 0 {
		e.PerUser = 1
	}
	if e.Time == 0 {
		e.Time = 30 * time.Second
	}
	if e.PerUser < 0 || e.Time < 0 || e.Rows < 0 {
		return e, fmt.Errorf("heavy: endpoint %q: negative bound", e.Name)
	}
	return e, nil
}

// Options configure a Limiter.
type Options struct {
	// User returns the identity whose cap a request counts against; ok false
	// means the request has none and is refused 401. Required.
	User func(*http.Request) (user string, ok bool)
	// InstallationCap bounds all heavy requests of all replicas together.
	// Default: a quarter of the pool's MaxConns, at least 1.
	InstallationCap int
	// Replica names this replica on its permits. Default host:pid.
	Replica string
	// OnRefused writes the response of a refused request. Default:
	// WriteRefusal (429 problem+json with Retry-After and RateLimit
	// headers).
	OnRefused func(http.ResponseWriter, *http.Request, *LimitError)
	// Logger receives release failures. Default slog.Default().
	Logger *slog.Logger
}

// Limiter claims heavy permits. It is safe for concurrent use.
type Limiter struct {
	leaser    *permit.Leaser
	instCap   int
	user      func(*http.Request) (string, bool)
	onRefused func(http.ResponseWriter, *http.Request, *LimitError)
	log       *slog.Logger
}

// New returns a Limiter keeping its permits in pool's database.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("heavy: nil pool")
	}
	if opts.User == nil {
		return nil, errors.New("heavy: Options.User is required")
	}
	if opts.InstallationCap < 0 {
		return nil, errors.New("heavy: negative InstallationCap")
	}
	if opts.InstallationCap == 0 {
		opts.InstallationCap = DefaultInstallationCap(pool.Config().MaxConns)
	}
	if opts.OnRefused == nil {
		opts.OnRefused = WriteRefusal
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	leaser, err := permit.New(pool, permit.Options{Kind: permit.HeavyPermit, Replica: opts.Replica})
	if err != nil {
		return nil, err
	}
	return &Limiter{leaser: leaser, instCap: opts.InstallationCap, user: opts.User, onRefused: opts.OnRefused, log: opts.Logger}, nil
}

// DefaultInstallationCap is max(1, maxConns / 4).
func DefaultInstallationCap(maxConns int32) int { return max(1, int(maxConns)/4) }

// InstallationCap is the cap over all heavy requests of all replicas.
func (l *Limiter) InstallationCap() int { return l.instCap }

// InstallationScope is the scope key shared by all heavy endpoints.
const InstallationScope = "installation"

// UserScope is the scope key of user's permits on endpoint.
func UserScope(endpoint, user string) string { return permit.ScopeKey("user", endpoint, user) }

// LimitError is a refused heavy request.
type LimitError struct {
	// Endpoint is the endpoint's name.
	Endpoint string
	// Limit is the cap that was reached.
	Limit int
	// Scope is whose cap it was.
	Scope Scope
	// RetryAfter is when the first running request of that scope reaches
	// its time bound, at least one second: by then a permit is free.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("heavy: %s: %s limit of %d reached", e.Endpoint, e.Scope, e.Limit)
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == pglimit.ErrLimited }

// Permit is a granted heavy request.
type Permit struct {
	lease  *permit.Lease
	bounds Bounds
}

// Bounds returns the bounds the permit was granted under.
func (p *Permit) Bounds() Bounds { return p.bounds }

// Release gives both permits back, in one statement. It outlives a canceled
// ctx (a client that went away still frees its permits).
func (p *Permit) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return p.lease.Release(ctx)
}

// Acquire claims a permit of ep for user, for callers that are not HTTP
// handlers (a job runner, a CLI). It returns a *LimitError when a cap is
// reached. Release the permit when the work ends, and bound the work with
// the permit's Bounds.
func (l *Limiter) Acquire(ctx context.Context, ep Endpoint, user string) (*Permit, error) {
	ep, err := ep.withDefaults()
	if err != nil {
		return nil, err
	}
	return l.acquire(ctx, ep, user)
}

func (l *Limiter) acquire(ctx context.Context, ep Endpoint, user string) (*Permit, error) {
	scopes := []permit.Scope{
		{Key: UserScope(ep.Name, user), Cap: ep.PerUser},
		{Key: InstallationScope, Cap: l.instCap},
	}
	lease, err := l.leaser.Claim(ctx, permit.Claim{Scopes: scopes, Holder: user, Endpoint: ep.Name, Lease: ep.Time + Grace})
	if err != nil {
		var refused *permit.RefusedError
		if errors.As(err, &refused) {
			le := &LimitError{Endpoint: ep.Name, Limit: refused.Scope.Cap, Scope: ScopeUser,
				RetryAfter: max(time.Second, refused.FirstLapse-Grace)}
			if refused.Scope.Key == InstallationScope {
				le.Scope = ScopeInstallation
			}
			return nil, le
		}
		return nil, err
	}
	return &Permit{lease: lease, bounds: Bounds{Endpoint: ep.Name, Time: ep.Time, Rows: ep.Rows}}, nil
}

// Handler serves next as the heavy endpoint ep: it claims the permits, runs
// next with the time bound on its context and the Bounds in it, and
// releases the permits when next returns, panics, or the client goes away.
// It panics if ep is invalid (a programming error, found at start-up).
func (l *Limiter) Handler(ep Endpoint, next http.Handler) http.Handler {
	ep, err := ep.withDefaults()
	if err != nil {
		panic(err)
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := l.user(r)
		if !ok {
			problem.Write(w, &problem.Details{Slug: "unauthorized", Title: "Unauthorized", Status: http.StatusUnauthorized,
				Detail: "This endpoint needs an authenticated user."})
			return
		}
		p, err := l.acquire(r.Context(), ep, user)
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				l.onRefused(w, r, le)
			} else {
				respond.Log(r.Context(), l.log, "heavy: claim failed", err, "endpoint", ep.Name)
				respond.Database(w, r, err)
			}
			return
		}
		defer func() {
			if err := p.Release(r.Context()); err != nil {
				l.log.WarnContext(r.Context(), "heavy: release failed; the permits lapse on their own",
					"endpoint", ep.Name, "user", user, "err", err)
			}
		}()
		ctx, cancel := context.WithTimeout(r.Context(), ep.Time)
		defer cancel()
		b := p.bounds
		b.Deadline, _ = ctx.Deadline()
		next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, boundsKey{}, b)))
	})
}

// WriteRefusal is the default refusal: 429 problem+json naming endpoint,
// limit and scope, with Retry-After and the RateLimit-Policy / RateLimit
// headers (quota unit concurrent-requests).
func WriteRefusal(w http.ResponseWriter, r *http.Request, e *LimitError) {
	policy := e.Endpoint
	if e.Scope == ScopeInstallation {
		policy = "heavy-installation"
	}
	retry := problem.RetryAfterSeconds(e.RetryAfter)
	h := http.Header{}
	h.Set("RateLimit-Policy", fmt.Sprintf("%q;q=%d;qu=\"concurrent-requests\"", policy, e.Limit))
	h.Set("RateLimit", fmt.Sprintf("%q;r=0;t=%d", policy, retry))
	detail := fmt.Sprintf("You already run %d %s request(s) at once, your limit; retry when one ends.", e.Limit, e.Endpoint)
	if e.Scope == ScopeInstallation {
		detail = fmt.Sprintf("The installation already runs %d heavy request(s) at once, its limit; retry when one ends.", e.Limit)
	}
	problem.Write(w, &problem.Details{
		Slug:       SlugTooMany,
		Title:      "Too many heavy requests",
		Status:     http.StatusTooManyRequests,
		Detail:     detail,
		Instance:   r.URL.Path,
		RetryAfter: time.Duration(retry) * time.Second,
		Extensions: map[string]any{"endpoint": e.Endpoint, "limit": e.Limit, "scope": string(e.Scope)},
		Header:     h,
	})
}

// Bounds are the bounds a heavy request runs under; handlers read them with
// FromContext.
type Bounds struct {
	// Endpoint is the endpoint's name.
	Endpoint string
	// Time is the endpoint's time bound.
	Time time.Duration
	// Deadline is when the time bound ends for this request.
	Deadline time.Time
	// Rows is the row cap; 0 means none.
	Rows int
}

type boundsKey struct{}

// FromContext returns the bounds of the heavy request ctx belongs to.
func FromContext(ctx context.Context) (Bounds, bool) {
	b, ok := ctx.Value(boundsKey{}).(Bounds)
	return b, ok
}

// NewContext returns ctx carrying b and ending at b.Deadline, for work done
// under a Permit outside an HTTP handler.
func NewContext(ctx context.Context, b Bounds) (context.Context, context.CancelFunc) {
	if b.Deadline.IsZero() {
		b.Deadline = time.Now().Add(b.Time)
	}
	ctx, cancel := context.WithDeadline(ctx, b.Deadline)
	return context.WithValue(ctx, boundsKey{}, b), cancel
}

// FormatLimit writes a time bound the way marks and problems name it:
// whole seconds as "30s", anything finer as Go writes it ("1.5s", "250ms").
func FormatLimit(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}
