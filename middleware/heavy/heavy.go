// Package heavy bounds expensive endpoints across every replica of a
// service.
//
// A heavy endpoint is one Limiter, made by New with three bounds: a per-key
// concurrency cap (Limit; the key is the user, as Options.Key reads it), a
// time bound (Time) and a row cap (Rows). A request claims a permit in its
// key's scope of the endpoint and one in the installation's scope, which
// caps all heavy requests of all replicas together (by default at a
// quarter of the connection pool, at least one, so heavy requests never
// take every connection from ordinary ones). Every heavy Limiter on a
// database shares the installation scope. Both permits are rows of the
// UNLOGGED heavy_permit table, claimed in one round trip and released in
// one when the request ends, however it ends; a replica that dies holds
// them until the time bound plus 30 s.
//
//	console, err := heavy.New(pool, heavy.Options{Name: "sql-console", Key: userOf, Limit: 2, Time: 30 * time.Second, Rows: 1000})
//	mux.Handle("POST /api/sql", console.Handler(sqlHandler))
//
// A refused request gets 429 too-many-heavy-requests naming the endpoint,
// the limit and whether it was the key's own or the installation's, with
// Retry-After and the IETF RateLimit-Policy / RateLimit headers. The
// handler's context carries the deadline of the time bound; Read runs a
// bounded read with statement_timeout set to what is left of it, and Stream
// copies rows until the row cap or the time bound and ends the output with a
// mark saying which stopped it. Acquire takes the same permits without
// HTTP, for a job runner or a CLI.
//
// # Unidentified requests
//
// A request whose key Options.Key cannot read (ok false, or an empty key)
// passes to next uncounted: it claims no permit, and runs under the time
// bound and the row cap all the same. A limiter is not an authenticator:
// put the authentication in front of it, or let next refuse the request.
//
// # Responses
//
// Every response the Handler writes itself goes through Options.OnError,
// WriteError by default: a refusal (*limit.Refusal, 429), a database that
// cannot be reached or did not answer within Options.Timeout (503
// database-unavailable), anything else (500, the error logged through
// Options.Logger, never sent). A client that went away gets nothing.
//
// # Cost and failures
//
// A heavy request costs two write transactions, the claim of both permits
// before its handler and their release before its answer completes, each
// one statement (or a share of one: a replica sends the claims and
// releases that arrive together in one round trip); BENCHMARKS.md measures
// them against that floor. Permits live in an UNLOGGED table: a crash of
// the database empties it, which frees every permit (the safe direction).
// A database that cannot be reached or does not answer within
// Options.Timeout fails the request (503).
//
// A Limiter is safe for concurrent use.
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
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/internal/retryafter"
	"github.com/pglimit/pglimit/internal/slots"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/problem"
)

// grace is added to an endpoint's time bound to make its permits' lease: a
// permit whose holder never released it lapses at bound + grace.
const grace = slots.Grace

// Problem type slugs of heavy refusals (see WriteError).
const (
	slugTooMany  = "too-many-heavy-requests"
	slugTimedOut = "heavy-request-timed-out"
)

// The scopes of a heavy refusal (limit.Refusal.Scope): the key's own cap
// on one endpoint, and the cap over all heavy requests of all replicas.
const (
	scopeUser         = "user"
	scopeInstallation = "installation"
)

// kindHeavy is the Kind of a heavy refusal: WriteError answers those
// alone as 429 too-many-heavy-requests.
const kindHeavy = "heavy"

// Options configure a Limiter: one heavy endpoint.
type Options struct {
	// Name is the endpoint's name, e.g. "sql-console": the `endpoint`
	// member of its problems, the RateLimit-Policy name, its permits'
	// endpoint and log lines. Required.
	Name string
	// Key returns the identity whose cap a request counts against, usually
	// the user; never a secret (it is stored on the permit). ok false, or
	// an empty key, lets the request pass to next uncounted (see
	// Unidentified requests). Required.
	Key func(*http.Request) (key string, ok bool)
	// Limit is how many requests of one key may run at once, across all
	// replicas: 1..pglimit.MaxLimit. Default 1.
	Limit int
	// Time bounds a request: its context ends Time after the permit is
	// granted, and database work run through Read has statement_timeout set
	// to what is left. Default 30s.
	Time time.Duration
	// Rows caps the rows a request may return (Stream stops there); 0
	// means no cap.
	Rows int
	// InstallationLimit bounds all heavy requests of all replicas together,
	// over every heavy Limiter of the database: 1..pglimit.MaxLimit.
	// Default: a quarter of the pool's MaxConns, at least 1.
	InstallationLimit int
	// Timeout bounds the database work of one claim or one release when
	// the caller's context has no sooner deadline, so a database that hangs
	// fails the request (503) instead of hanging it. The Handler's answer
	// waits for the release of its permits for as long as the database
	// answers within it (less a sixteenth); past that the answer goes out
	// and the release goes on in the background. Default 5s.
	Timeout time.Duration
	// Replica names this replica on its permits. Default host:pid.
	Replica string
	// OnError writes every response the Handler writes itself: a refusal
	// (*limit.Refusal) and a failed claim (the database unreachable or timed
	// out, a client that went away, anything else). The Handler has logged
	// a failure that is not a refusal before it calls OnError. Default:
	// WriteError.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Logger receives failed claims and releases, and in dry run the
	// requests it would have refused. Default slog.Default(), taken when
	// New runs.
	Logger *slog.Logger
	// MeterProvider gives the meter of the metrics pglimit.decisions
	// (attributes limit = Name, outcome, scope user or installation) and
	// pglimit.decision.duration (op claim, release). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// DryRun decides as usual but refuses nobody: a request that would
	// have been refused runs without a permit (the scope is full: there is
	// none to take), with the RateLimit-Policy and RateLimit headers its
	// refusal would have had, is counted with outcome dry-run-refused and
	// logged (at most a line a second). Granted requests take and release
	// their permits as usual, so what is held, and so every later
	// decision, is what it would be with the limit on. Default false.
	DryRun bool
}

// Limiter is one heavy endpoint: it claims its permits. It is safe for
// concurrent use.
type Limiter struct {
	core    *slots.Limiter
	limit   int
	time    time.Duration
	rows    int
	instCap int
	key     func(*http.Request) (string, bool)
	onError func(http.ResponseWriter, *http.Request, error)
}

// New returns the Limiter of one heavy endpoint, keeping its permits in
// pool's database. It checks opts and starts nothing.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if opts.Name == "" {
		return nil, errors.New("heavy: Options.Name is required")
	}
	if opts.Key == nil {
		return nil, errors.New("heavy: Options.Key is required")
	}
	pkg := "heavy: " + opts.Name
	cfg := slots.Config{Pkg: pkg, Name: opts.Name, Kind: permit.HeavyPermit,
		Scopes: []string{scopeUser, scopeInstallation}, Replica: opts.Replica, Timeout: opts.Timeout,
		Logger: opts.Logger, MeterProvider: opts.MeterProvider, DryRun: opts.DryRun}
	if err := slots.Check(pool, &cfg); err != nil {
		return nil, err
	}
	if opts.Limit == 0 {
		opts.Limit = 1
	}
	if opts.InstallationLimit == 0 {
		opts.InstallationLimit = max(1, int(pool.Config().MaxConns)/4)
	}
	if opts.Time == 0 {
		opts.Time = 30 * time.Second
	}
	if err := errors.Join(vocab.CheckCap(pkg, "Limit", opts.Limit), vocab.CheckCap(pkg, "InstallationLimit", opts.InstallationLimit),
		vocab.CheckDuration(pkg, "Time", opts.Time)); err != nil {
		return nil, err
	}
	if opts.Rows < 0 {
		return nil, fmt.Errorf("%s: negative Rows", pkg)
	}
	if opts.OnError == nil {
		opts.OnError = WriteError
	}
	core, err := slots.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Limiter{core: core, limit: opts.Limit, time: opts.Time, rows: opts.Rows, instCap: opts.InstallationLimit,
		key: opts.Key, onError: opts.OnError}, nil
}

// installationScope is the scope key shared by all heavy endpoints.
const installationScope = "installation"

// keyScope is the scope key of key's permits on the endpoint name.
func keyScope(name, key string) string { return permit.ScopeKey("user", name, key) }

// Flush waits until every permit released so far has reached the
// database. Call it at shutdown, after the server stopped serving
// (http.Server.Shutdown returned), so that no release is lost with the
// process.
func (l *Limiter) Flush(ctx context.Context) error { return l.core.Flush(ctx) }

// Acquire claims a permit of the endpoint for key, for callers that are not
// HTTP handlers (a job runner, a CLI). It returns a *limit.Refusal
// (errors.Is pglimit.ErrLimited; Kind "heavy", Scope "user" or
// "installation") when a cap is reached — in dry run a Permit holding
// none instead, whose Refusal says so; any other error is the database's
// (pglimit.Classify) or ctx's. Release gives both permits back, in one
// statement; permits never released lapse on their own at the endpoint's
// Time + 30 s after the claim. Release the permit when the work ends, and bound the
// work with the endpoint's: NewContext(ctx, l.Bounds()).
func (l *Limiter) Acquire(ctx context.Context, key string) (*limit.Permit, error) {
	held, refusal, err := l.acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return limit.NewPermit(held.ReleaseFunc(), refusal), nil
}

// acquire claims the permits of key: held, or in dry run the refusal let
// through; a refusal is the error otherwise.
func (l *Limiter) acquire(ctx context.Context, key string) (slots.Held, *limit.Refusal, error) {
	name := l.core.Name
	held, refused, letThrough, err := l.core.Claim(ctx, key, permit.Claim{
		Scopes: []permit.Scope{{Key: keyScope(name, key), Cap: l.limit, Kind: scopeUser},
			{Key: installationScope, Cap: l.instCap, Kind: scopeInstallation}},
		Holder: key, Endpoint: name, Lease: l.time + grace,
	})
	return slots.Outcome(held, refused, letThrough, err, func(r *slots.Refused) *limit.Refusal {
		return &limit.Refusal{Kind: kindHeavy, Name: name, Scope: r.Scope.Kind, Limit: r.Scope.Cap, RetryAfter: slots.RetryAfter(r, grace)}
	})
}

// Bounds are the bounds of the endpoint (its Deadline zero): work done
// under a Permit outside an HTTP handler (a job, a gRPC call) runs in
// NewContext(ctx, l.Bounds()), as Handler runs a request.
func (l *Limiter) Bounds() Bounds { return l.bounds() }

func (l *Limiter) bounds() Bounds { return Bounds{Endpoint: l.core.Name, Time: l.time, Rows: l.rows} }

// Handler serves next as the heavy endpoint: it claims the permits, runs
// next with the time bound on its context and the Bounds in it, and
// releases the permits when next returns, panics, or the client goes away,
// before the answer completes (see limit.Permit.Release). An unidentified
// request runs under the bounds without a permit.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := l.key(r)
		if !ok || key == "" {
			ctx, cancel := NewContext(r.Context(), l.bounds())
			defer cancel()
			next.ServeHTTP(w, r.WithContext(ctx))
			return
		}
		held, refusal, err := l.acquire(r.Context(), key)
		if err != nil {
			l.core.Failed(r.Context(), err)
			l.onError(w, r, err)
			return
		}
		if refusal != nil {
			// Dry run: the headers the refusal would have had, no permit.
			addRateLimitHeaders(w.Header(), refusal)
		}
		// The answer completes once the permits are back, while the
		// database answers within Options.Timeout; a failed release is
		// logged by the Leaser.
		actx := slots.Answer(r.Context())
		defer held.ReleaseBeforeAnswer(actx)
		ctx, cancel := NewContext(actx, l.bounds())
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// writeRefusal is the 429 of a *limit.Refusal: problem+json naming
// endpoint, limit and scope, with Retry-After and the RateLimit-Policy /
// RateLimit headers (quota unit concurrent-requests).
func writeRefusal(w http.ResponseWriter, r *http.Request, e *limit.Refusal) {
	retry := retryafter.Seconds(e.RetryAfter)
	h := http.Header{}
	addRateLimitHeaders(h, e)
	detail := fmt.Sprintf("You already run %d %s request(s) at once, your limit; retry when one ends.", e.Limit, e.Name)
	if e.Scope == scopeInstallation {
		detail = fmt.Sprintf("The installation already runs %d heavy request(s) at once, its limit; retry when one ends.", e.Limit)
	}
	respond.TooMany(w, r, &problem.Details{
		Slug:       slugTooMany,
		Title:      "Too many heavy requests",
		Detail:     detail,
		Extensions: map[string]any{"endpoint": e.Name, "limit": e.Limit, "scope": e.Scope},
		Header:     h,
	}, retry)
}

// addRateLimitHeaders adds the RateLimit-Policy and RateLimit fields of
// the refusal e to h (added: the fields are lists, and an outer limit's
// items stay beside these).
func addRateLimitHeaders(h http.Header, e *limit.Refusal) {
	policy := e.Name
	if e.Scope == scopeInstallation {
		policy = "heavy-installation"
	}
	h.Add("RateLimit-Policy", fmt.Sprintf("%q;q=%d;qu=\"concurrent-requests\"", policy, e.Limit))
	h.Add("RateLimit", fmt.Sprintf("%q;r=0;t=%d", policy, retryafter.Seconds(e.RetryAfter)))
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

// NewContext returns ctx carrying b and ending at b.Deadline (b.Time from
// now when b.Deadline is zero), or at ctx's own deadline when that is
// sooner, which the Bounds in the context then say: work done under a
// Permit outside an HTTP handler runs in NewContext(ctx, l.Bounds()).
func NewContext(ctx context.Context, b Bounds) (context.Context, context.CancelFunc) {
	if b.Deadline.IsZero() {
		b.Deadline = time.Now().Add(b.Time)
	}
	ctx, cancel := context.WithDeadline(ctx, b.Deadline)
	b.Deadline, _ = ctx.Deadline()
	return context.WithValue(ctx, boundsKey{}, b), cancel
}

// formatLimit writes a time bound the way marks and problems name it:
// whole seconds as "30s", anything finer as Go writes it ("1.5s", "250ms").
func formatLimit(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}
