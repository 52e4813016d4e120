// Package inflight caps the requests an API token has in flight at once,
// across every replica of a service.
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
// WriteError by default: a refusal (*limit.Refusal, 429), a database that
// cannot be reached or did not answer within Options.Timeout (503
// database-unavailable), anything else (500, logged through
// Options.Logger, never sent). A client that went away gets nothing.
//
// # Cost and failures
//
// Without Keep, a request costs two write transactions: the claim before
// its handler and the release before its answer completes, each one
// statement (or a share of one: a replica sends the claims and releases
// that arrive together in one round trip). BENCHMARKS.md measures them
// against their floor, two one-row upserts. With Keep (see Kept slots), a
// steady client — one request after another on one replica — costs a
// share of a statement: measured (TestKeptSteadyClient,
// TestKeptSlotRenewed), 0.0005 statements on the slot table per request
// for back-to-back requests, 0.016 for requests 2 ms apart under a 1 s
// lease (the renewals; at the default lease a renewal is due every 5 s);
// and BenchmarkWholeRequestKept (six runs on 2 shared CPUs), a whole
// HTTP request at p50 1.34–1.56× the handler alone (25–29 µs alone,
// 34–45 µs kept) where the same request claiming and releasing is
// 8.8–12.3× (221–355 µs).
// The slot lives in an UNLOGGED table: a crash
// of the database empties it, which frees every token's slots (the safe
// direction for a cap). A database that cannot be reached or does not
// answer within Options.Timeout fails the request (503).
//
// # Kept slots
//
// With Options.Keep, the slot a request of a token held stays with its
// replica, still a row of request_in_flight, for up to Keep after the
// request ends, and the token's next request on that replica takes it
// from memory, with no statement. The bound holds as without Keep:
// never more requests of a token in flight than Limit across every
// replica, because a request runs only while its replica holds a row for
// it (kept slots are rows), and starts on a kept one only while its lease
// has at least MaxDuration + 30 s left, as a fresh claim's has. A kept
// claim's lease is MaxDuration + 30 s + 10 s (the 10 s: a quarter of the
// lease at most), renewed for every kept slot of the replica in one
// statement when it has less than MaxDuration + 35 s left: a slot in
// steady use costs a statement every 5 s, not one per request. The slots
// of a replica killed while it keeps them lapse, as any, at the end of
// their lease: at most MaxDuration + 40 s after their last claim or
// renewal (TestKeptSlotsOfKilledReplicaLapse).
//
// Idle slots are given back in batches, one statement for many: those
// idle longer than Keep, within a sweep period (Keep/2, 5 ms..1 s) after;
// every idle one while the replica's invalidation bus is not Live (it
// then keeps none, and, refused, asks for none); and at
// once those of a token another replica was refused for: the refused
// replica asks on the bus, the replicas that keep idle slots of the token
// give them back and say so, and the refused request claims again when
// it hears so, and once more 100 ms after it was refused, before it
// answers 429 (a true refusal is so delayed by at most 100 ms). A replica
// that was asked keeps none of the token's slots for a second: its
// requests release at their end, as without Keep. The longest a token can
// be refused while it has room (fewer than Limit requests in flight, idle
// kept slots elsewhere filling its rows): with the holders' buses Live,
// only as long as their give-back takes past the 100 ms wait (in
// TestKeptMovingToken, a token at its limit alternating between two
// replicas for 40 rounds, 0 refusals); in any case, Keep + the sweep
// period + one statement after the idle slot's request ended.
//
// # Shares
//
// By default (Options.Shares, 4, at most Limit − 1; none with Keep) that
// many slots of every token's Limit are kept apart, one per share, and a
// replica that holds one of the shares' leases (pglimit.share, while its
// invalidation bus listens) runs one request of every token on it, in
// memory: no claim, no release, no statement. The database decides the
// rest: a claim there may take Limit less the shares still reserved for
// the token. A token that needs more — a request while its replica's
// share is busy with another of its requests — is claimed in the
// database; refused there while shares still hold the token, the claim
// asks them on the bus to give the token up (each stops running it on its
// share, at once or when its request there ends, says so, and never takes
// it back while it lives), and is judged again. So a token with at most
// one request in flight on each replica (a user who sends a request every
// few seconds, spread by a balancer) costs nothing, and one that needs its
// whole Limit on one replica gets it after a bus round trip
// (TestSharedSlotsHoldTheCap: 2,544 of 2,883 cold requests run on a share;
// a token at 7 of 8 on one replica never refused; a token at 150 % never
// more than 8 at once, by the handler's own count). A new holder runs
// nothing on its share for MaxDuration + 35 s after its claim (by then
// every slot claimed without counting it has lapsed); a holder whose
// lease ran out counts as reserved for MaxDuration + 30 s more (its last
// requests may run that long). Every replica must have the same Shares.
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

// slugTooMany is the problem type slug of a refused request.
const slugTooMany = "too-many-requests-in-flight"

// grace is added to MaxDuration to make a slot's lease: a slot whose
// holder vanished lapses MaxDuration + grace after it was claimed.
const grace = slots.Grace

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
	// fails the request (503) instead of hanging it. The Handler's answer
	// waits for the release of its slot for as long as the database
	// answers within it (less a sixteenth); past that the answer goes out
	// and the release goes on in the background. Default 5s.
	Timeout time.Duration
	// Replica names this replica on its rows. Default host:pid.
	Replica string
	// OnError writes every response the Handler writes itself: a refusal
	// (*limit.Refusal) and a failed claim. The Handler has logged a failure
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
	// Keep, when positive, keeps the slot of a token's request with this
	// replica for up to Keep after the request ends, so that the token's
	// next request here takes it from memory, with no statement (see Kept
	// slots). Run the invalidation bus (pglimit.Run) and set the same Keep
	// on every replica: a replica whose bus is not Live keeps nothing.
	// Default 0: every request claims and releases its slot. Negative is
	// an error.
	Keep time.Duration
	// Shares is how many replicas may each run one request of every token
	// in memory, on a share, with no statement (see Shares): that many
	// slots of every token's Limit are kept apart, one per share, and the
	// database decides the rest, until a token needs more (a claim refused
	// while shares hold the token asks them on the bus to give it up, and
	// waits for it). A token with at most one request in flight on a
	// replica at a time — one every few seconds, spread by a balancer —
	// costs no statement to claim or release. Exact across replicas; a
	// replica takes a share only while its invalidation bus listens
	// (pglimit.Run), and a new holder runs nothing on its share for
	// MaxDuration + 35 s. Every replica must have the same Shares and run
	// the bus: one that cannot hear the holders give a token up decides
	// only what is left apart from the shares. -1 turns it off; with Keep
	// there are none. Default 4, at most Limit − 1.
	Shares int
}

// refusalRetry is the most a refusal's RetryAfter says: requests in
// flight end at any moment, and a token's next request then fits; the
// lapse of its first slot (MaxDuration + 30 s away) says only when one
// surely will.
const refusalRetry = 2 * time.Second

// defaultShares is Options.Shares' default.
const defaultShares = 4

// scopeToken is the kind of scope of every decision (attribute scope).
const scopeToken = "token"

// kindInflight is the Kind of an in-flight refusal: WriteError answers
// those alone as 429 too-many-requests-in-flight.
const kindInflight = "inflight"

// Limiter caps requests in flight per token. It is safe for concurrent use.
type Limiter struct {
	core    *slots.Limiter
	limit   int
	maxDur  time.Duration
	grace   time.Duration
	key     func(*http.Request) (string, bool)
	onError func(http.ResponseWriter, *http.Request, error)
}

// New returns a Limiter keeping its slots in pool's database. It checks
// opts and starts nothing.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	return newLimiter(pool, opts, grace)
}

func newLimiter(pool *pgxpool.Pool, opts Options, grace time.Duration) (*Limiter, error) {
	if opts.Key == nil {
		return nil, errors.New("inflight: Options.Key is required")
	}
	if opts.Name == "" {
		opts.Name = "in-flight"
	}
	if opts.Limit == 0 {
		opts.Limit = 8
	}
	if opts.MaxDuration == 0 {
		opts.MaxDuration = 2 * time.Minute
	}
	if opts.OnError == nil {
		opts.OnError = WriteError
	}
	if err := errors.Join(vocab.CheckCap("inflight", "Limit", opts.Limit),
		vocab.CheckDuration("inflight", "MaxDuration", opts.MaxDuration)); err != nil {
		return nil, err
	}
	switch {
	case opts.Shares < -1 || opts.Shares > 64:
		return nil, fmt.Errorf("inflight: Options.Shares %d: want -1 (off) to 64", opts.Shares)
	case opts.Shares == 0:
		opts.Shares = defaultShares
	}
	opts.Shares = min(opts.Shares, opts.Limit-1)
	cfg := slots.Config{Pkg: "inflight", Name: opts.Name, Kind: permit.RequestInFlight,
		Scopes: []string{scopeToken}, Replica: opts.Replica, Timeout: opts.Timeout, Logger: opts.Logger,
		MeterProvider: opts.MeterProvider, DryRun: opts.DryRun, Keep: opts.Keep,
		Shares: opts.Shares, Linger: opts.MaxDuration + grace}
	if err := slots.Check(pool, &cfg); err != nil {
		return nil, err
	}
	core, err := slots.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Limiter{core: core, limit: opts.Limit, maxDur: opts.MaxDuration, grace: grace,
		key: opts.Key, onError: opts.OnError}, nil
}

// scopeOf is the scope key of key's slots in request_in_flight.
func scopeOf(key string) string { return permit.ScopeKey("token", key) }

// TokenKey is an identity for a raw token that has no id of its own: the
// first 16 bytes of its SHA-256, in hex. It is safe to store; the token is
// not. Use it only for tokens with enough entropy to resist guessing (a
// random API token does; a password would not).
func TokenKey(raw string) string {
	sum := sha256.Sum256([]byte(raw))
	return "sha256:" + hex.EncodeToString(sum[:16])
}

// Flush waits until every slot released so far has reached the database.
// Call it at shutdown, after the server stopped serving
// (http.Server.Shutdown returned), so that no release is lost with the
// process.
func (l *Limiter) Flush(ctx context.Context) error { return l.core.Flush(ctx) }

// MaxDuration is the longest a request may run (Options.MaxDuration): a
// front other than Handler (a gRPC interceptor) ends the work's context
// then, as Handler does.
func (l *Limiter) MaxDuration() time.Duration { return l.maxDur }

// Acquire claims a slot of key, for callers that are not HTTP handlers. It
// returns a *limit.Refusal (errors.Is pglimit.ErrLimited; Kind
// "inflight", Scope "token") when key has Limit requests in flight — in
// dry run a Permit without a slot instead, whose Refusal says so; any
// other error is the database's (pglimit.Classify) or ctx's. Release the
// permit when the work ends, and end the work within MaxDuration; with
// Options.Keep, Release may keep the slot for the token's next request
// (see Kept slots). The release leaves at once, in the Limiter's next
// round trip, shared with the claims and releases made meanwhile; a slot
// never released lapses at MaxDuration + 30 s after the claim.
func (l *Limiter) Acquire(ctx context.Context, key string) (*limit.Permit, error) {
	held, refusal, err := l.acquire(ctx, key, l.core.Name)
	if err != nil {
		return nil, err
	}
	return limit.NewPermit(held.ReleaseFunc(), refusal), nil
}

// acquire claims a slot of key for endpoint: held, or in dry run the
// refusal let through; a refusal is the error otherwise.
func (l *Limiter) acquire(ctx context.Context, key, endpoint string) (slots.Held, *limit.Refusal, error) {
	held, refused, letThrough, err := l.core.Claim(ctx, key, permit.Claim{
		Scopes: []permit.Scope{{Key: scopeOf(key), Cap: l.limit, Kind: scopeToken}},
		Holder: key, Endpoint: endpoint, Lease: l.maxDur + l.grace,
	}, "cap", l.limit, "endpoint", endpoint)
	return slots.Outcome(held, refused, letThrough, err, func(r *slots.Refused) *limit.Refusal {
		// A request of the token may end at any moment (its slot is
		// released before its answer): trying again in a moment can
		// succeed. The lapse of its first slot bounds the wait.
		retry := min(slots.RetryAfter(r, l.grace), refusalRetry)
		return &limit.Refusal{Kind: kindInflight, Name: l.core.Name, Scope: scopeToken, Limit: l.limit, RetryAfter: retry}
	})
}

// Handler caps the requests to next in flight per token: it claims a slot
// (429 when the token has none free), runs next with its context ending at
// MaxDuration, and releases the slot when next returns, panics, or the
// client goes away, before the answer completes (see limit.Permit.Release). An
// unidentified request passes to next as it is.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := l.key(r)
		if !ok || key == "" {
			next.ServeHTTP(w, r)
			return
		}
		held, _, err := l.acquire(r.Context(), key, endpointOf(r))
		if err != nil {
			l.core.Failed(r.Context(), err)
			l.onError(w, r, err)
			return
		}
		// The answer completes once the slot is back, while the database
		// answers within Options.Timeout (see limit.Permit.Release).
		actx := slots.Answer(r.Context())
		defer held.ReleaseBeforeAnswer(actx)
		ctx, cancel := context.WithTimeout(actx, l.maxDur)
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

// WriteError answers a failed request; it is the default Options.OnError:
//
//   - *limit.Refusal: 429 too-many-requests-in-flight with Retry-After and the
//     members limit and retryAfter (seconds);
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     database-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: the Handler logs before it calls OnError.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	e := respond.Refusal(w, r, err, kindInflight)
	if e == nil {
		return
	}
	retry := retryafter.Seconds(e.RetryAfter)
	respond.TooMany(w, r, &problem.Details{
		Slug:       slugTooMany,
		Title:      "Too many requests in flight",
		Detail:     fmt.Sprintf("This token already has %d requests in flight, its limit; retry when one ends.", e.Limit),
		Extensions: map[string]any{"limit": e.Limit, "retryAfter": retry},
	}, retry)
}
