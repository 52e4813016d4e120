// Package signin throttles failed sign-ins across every replica of a
// service, counting them in PostgreSQL's UNLOGGED login_attempt table.
//
//	throttle, err := signin.New(pool, signin.Options{Limit: 5, Window: 15 * time.Minute})
//	mux.Handle("POST /api/session", throttle.Handler(signInHandler)) // 401 = failure, 2xx = success
//
// # The rule
//
// Failed sign-ins are counted per client key, by default the normalised
// username (trimmed, NFKC, Unicode case-folded). Once a key has Limit
// failures (default 5) in the Window that opened with its first failure
// (default 15 minutes), every sign-in of that key is refused with 429
// too-many-failed-sign-ins and Retry-After until the window lapses —
// whether the password is right or not. A successful sign-in clears the
// key's failures. The throttle keys on the username alone: it never trusts
// X-Forwarded-For, and a key function of the application's own can add
// other identities.
//
// # The threat model: three counters
//
// An online guessing attack comes in three shapes, and a throttle that
// counts only one of them either lets another through or lets an attacker
// lock any account out (OWASP's "account lockout" denial of service: a
// username's throttle alone, at 5, locks its owner out from everywhere as
// soon as anyone fails five times for her). Three Limiters, one per Scope,
// each bound one shape:
//
//   - "pair" bounds guessing one account from one client: Limit failures
//     per username and client address (or device, below). It is the
//     strict, small number (5), and it locks out only that client.
//   - "address" bounds password spraying (one password tried against many
//     usernames from one client address): Limit failures per address over
//     every username. A successful sign-in gives back its own attempt but
//     clears nothing, so an attacker's own account does not reset it.
//   - "username" bounds credential stuffing from many addresses against one
//     account: Limit failures per username over every client, a larger
//     number (50). It does not apply to a client presenting a device cookie
//     (Devices) that an earlier successful sign-in of the username set:
//     the user signs in from the devices she used before while an attacker
//     elsewhere fails for her, and a run from many addresses is still held
//     to Limit for every client without the cookie. A device cookie
//     replaces the address in the pair, so a cookie that fails the pair's
//     Limit is locked out itself, as an address would be.
//
// Wrap them widest first:
//
//	byAddress, _ := signin.New(pool, signin.Options{Scope: "address", Limit: 20, Addresses: addrs})
//	byPair, _ := signin.New(pool, signin.Options{Scope: "pair", Limit: 5, Addresses: addrs, Devices: devices})
//	byUsername, _ := signin.New(pool, signin.Options{Scope: "username", Limit: 50, Devices: devices})
//	mux.Handle("POST /login", byAddress.Handler(byPair.Handler(byUsername.Handler(login))))
//
// Each is strict under a parallel burst and holds across replicas. The
// widest is asked (and, strict, reserved) first: a sign-in it refuses never
// reaches the inner ones, and a sign-in an inner one refuses gives the
// outer attempts back. A refusal names its scope (limit.Refusal.Scope, the
// problem member scope: "pair", "address" or "username"). Reset clears any
// of them (the pair's: every client of the username). Behind a proxy, give
// the "address" and "pair" Limiters the clientaddr.Resolver that keys
// every other address limit (Options.Addresses): a request whose trusted
// proxy names no client address is refused 400 client-address-unreadable
// and counted nowhere.
//
// # The allow list
//
// Options.Exempt lets the sign-ins it names through uncounted and never
// refused, counted in pglimit.decisions with outcome "exempt": give the
// address's Limiter middleware/rules.Allowed, and the sign-ins from a
// client address an operator allowed (an office behind one NAT address, a
// monitoring probe) are neither counted nor refused by the address's
// throttle. Give it to the address's Limiter only: a username's throttle
// that exempted would let an allowed client guess one account's password
// without end.
//
// # Strict by default
//
// Password guessing is parallel by nature, so the throttle reserves each
// attempt before its password is checked (LoginAttemptReserve: the attempt
// counts as a failure up front, only while the key is under the limit, in
// one atomic statement): never more than Limit passwords of a key are
// checked in a window, however many arrive at once. Options.Lenient opts
// out: the count is read before the password is checked and written after,
// so attempts already in flight when the limit is reached are still
// evaluated (under a burst of concurrent wrong passwords more than Limit
// are checked; the tests measure it).
//
// # Cost
//
// A sign-in costs one write, the reservation; a failed one nothing more
// (the reservation counted it); a success clears the key (one delete), and
// a request that turns out not to be an attempt gives the reservation back
// (LoginAttemptUnreserve, and LoginAttemptDeleteEmpty when that leaves the
// key no failure). With Scope "address" a success gives its reservation
// back too: an address's successful sign-in costs a write and the give
// back. So the ADR's "a sign-in costs a read" becomes a
// write and a delete for a successful sign-in in strict mode: BENCHMARKS.md
// measures it; sign-ins are rare beside API requests. Lenient: a read
// (LoginAttemptGet), an upsert for a failure (LoginAttemptRecordFailure), a
// delete for a success after failures, nothing for a success with none.
// Every write runs on the pool, as a statement of its own — its own
// transaction, never the request's — so a failure is counted even when the
// handler's transaction rolls back. Refusals are added to the
// installation's count per minute (pglimit.Refusals) in the background,
// batched, about one statement a second per limiter and replica while it
// refuses.
//
// # Refusals from memory
//
// A throttled key stays throttled until its window ends: only a write that
// lowers its count (a success that clears it, a reservation given back,
// an operator's Reset) can let it in sooner, and each of those tells every
// replica right after it (BusNotify, a pg_notify). So while pglimit.Run listens
// for those notifications, a replica answers a throttled key's sign-ins
// from memory until the window ends, with no statement (at most 10,000
// keys, about 3 MB; see internal/memo), counted in pglimit.decisions with
// the attribute source "memory". Dry run never does.
//
// # A database that cannot be reached
//
// cannot throttle: the sign-in fails closed with 503 sign-in-unavailable and
// the handler never runs. A failure that cannot be recorded turns the
// handler's 401 into the same 503.
//
// # Unidentified requests
//
// A request whose key Options.Key cannot read (the default: a body with no
// username — a JSON object, whatever its Content-Type, or a form) is
// refused 400 invalid-sign-in-request and the handler never runs. This is
// the one limiter that does not let an unidentified request through: it
// guards a password check, wraps only the sign-in route, and a password it
// cannot count must not be checked (fail closed, as when the database
// cannot be reached). The Handler buffers the body first, so the handler
// reads it again from the start.
//
// # Responses
//
// Every response the Handler writes itself goes through Options.OnError,
// WriteError by default: a throttled key (*limit.Refusal, 429), a body larger
// than MaxBodyBytes (413 sign-in-request-too-large), a body that cannot be
// read or carries no key (400 invalid-sign-in-request), a database that cannot be reached or
// timed out, or a failure that could not be recorded (503
// sign-in-unavailable), anything else (500, logged through Options.Logger,
// never sent). A client that went away gets nothing.
//
// # What the application must do
//
//   - Wrap only the sign-in handler with Handler (or call Acquire and the
//     Permit's methods from non-HTTP code).
//   - Check credentials in the same way whether the username exists or not:
//     for an unknown username run the password hash comparison against a
//     dummy hash of the same cost (bcrypt.CompareHashAndPassword(dummy,
//     password)) and answer exactly as for a wrong password (401, same body,
//     same headers). The throttle itself treats unknown usernames exactly
//     like known ones — it never looks users up — so its responses and its
//     statements are the same for both.
//   - Say how the attempt ended, either by the status it writes (401: a
//     failed attempt; 2xx: a success; anything else, a panic, or nothing
//     written: not an attempt) or explicitly, before writing, with Fail,
//     Succeed or Release on the Permit of the request's context
//     (FromContext; a nil Permit's methods do nothing). The first outcome
//     reported counts; the status is only looked at when none was reported.
//     Report explicitly when a handler's own status codes differ.
//
// A Limiter is safe for concurrent use.
package signin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/internal/retryafter"
	"github.com/pglimit/pglimit/internal/throttle"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/problem"
)

// Problem type slugs of the sign-in throttle (see WriteError).
const (
	slugTooMany     = "too-many-failed-sign-ins"
	slugUnavailable = "sign-in-unavailable"
	slugInvalid     = "invalid-sign-in-request"
	slugTooLarge    = "sign-in-request-too-large"
	slugAddress     = "client-address-unreadable"
)

// Defaults of Options.
const (
	defaultName               = "sign-in"
	defaultAddressName        = "sign-in-address"
	defaultPairName           = "sign-in-pair"
	defaultLimit              = 5
	defaultWindow             = 15 * time.Minute
	defaultMaxBodyBytes int64 = 64 << 10
	defaultTimeout            = 5 * time.Second
)

// Options configure a Limiter. The zero value is ready to use.
type Options struct {
	// Name is the limit's name, in log lines. Default "sign-in", or
	// "sign-in-address" when Scope is "address".
	Name string
	// Scope is what the key counts: "username" (the failures of one
	// username over every client; a successful sign-in clears them),
	// "pair" (the failures of one username from one client: its address,
	// or its device when it presents a device cookie of the username; a
	// successful sign-in clears the pair) or "address" (the failures of
	// one client address over every username, against password spraying;
	// a successful sign-in gives back its own attempt and clears nothing
	// else). It is the scope a refusal names (limit.Refusal.Scope). Wrap
	// an "address" Limiter around a "pair" one around a "username" one
	// (see the package documentation). Default "username".
	Scope string
	// Username returns the normalised username (NormalizeUsername) of a
	// sign-in request, from a copy of the request whose body it may read;
	// ok false, or "", is a request without one (400). It makes the
	// default keys of every Scope and names the username of a device
	// cookie. Give it the handler's own parse (see Key). Default: the
	// member "username" of a body that is one JSON object and nothing
	// after it, or of a form, normalised.
	Username func(*http.Request) (username string, ok bool)
	// Addresses keys the client address of the default keys of Scope
	// "address" and "pair": the peer, or what a proxy it trusts forwarded
	// in the one header it reads. A request from a trusted proxy whose
	// header names no client address (clientaddr.ErrUnreadable) is refused
	// 400 client-address-unreadable and counted nowhere. Default: a
	// Resolver trusting no proxy (the peer's address; an IPv6 address
	// stands for its /64).
	Addresses *clientaddr.Resolver
	// Devices are the device cookies (see Devices) of the default keys:
	// with Scope "username", a request presenting a valid cookie of its
	// username is not counted (outcome exempt) and a successful sign-in
	// sets the cookie; with Scope "pair", a request presenting one is
	// counted per (username, device) instead of (username, address).
	// Default none.
	Devices *Devices
	// Key, when set, returns the client key of a sign-in request in place of
	// the default keys of Scope (Username, Addresses and Devices then make
	// no key; Devices still exempts and sets cookies with Scope
	// "username"). It is given a copy of
	// the request whose body it may read (the handler gets the body again
	// from the start). ok false, or an empty key, refuses the request 400
	// (see Unidentified requests) before anything is written. Key should
	// refuse every body the handler refuses without judging a password
	// (unknown members, a missing password, wrong types, trailing data):
	// a body Key accepts is reserved, and a strict Limiter's reservation,
	// given back when the handler answers neither 2xx nor 401, leaves its
	// row until the window lapses — so a Key laxer than the handler lets
	// anyone write throttle rows without a password check. Give Key the
	// handler's own parse (or give it to Username, which every default
	// key reads). Default, by Scope, from Username, Addresses and Devices:
	// "username:" and the username; "address:" and the client address
	// ("address:unknown" for a peer that is not an IP address) of a
	// request with a username; "pair:", the username, "|", and "address:"
	// and the client address, or "device:" and the device's id for a
	// request presenting a valid device cookie of the username. No default
	// key reads a forwarded header but through Addresses, told which
	// proxies to trust.
	Key func(*http.Request) (key string, ok bool)
	// Limit is how many failed sign-ins a key may have in one window
	// (1..pglimit.MaxLimit); once it has that many, every sign-in of the key
	// is refused until the window lapses. Default 5.
	Limit int
	// Window is how long failures count: the window opens with a key's first
	// failure and lapses Window later (later failures do not extend it).
	// Default 15 minutes.
	Window time.Duration
	// Lenient reads a key's count before the password is checked and
	// writes the failure after, instead of reserving the attempt first:
	// cheaper for a successful sign-in (a read instead of a write and a
	// delete), but the attempts in flight when the limit is reached are
	// still evaluated, so a parallel burst checks more than Limit
	// passwords. Default false: strict, never more than Limit passwords
	// of a key checked in a window.
	Lenient bool
	// MaxBodyBytes bounds the request body Handler buffers for Key and the
	// handler. Default 64 KiB.
	MaxBodyBytes int64
	// Timeout bounds the database work of one check and of each write of
	// an outcome when the caller's context has no sooner deadline, so a
	// database that hangs fails the sign-in (503) instead of hanging it.
	// Default 5s.
	Timeout time.Duration
	// OnError writes every response the Handler writes itself: a throttled
	// key (*limit.Refusal), a body too large (*http.MaxBytesError) or
	// unreadable or without a key (ErrInvalidRequest), a client address a
	// trusted proxy did not name (clientaddr.ErrUnreadable), a failed
	// check, a failure that could not be recorded (ErrNotRecorded). The Handler has logged a failure that
	// is not a refusal before it calls OnError. Default: WriteError.
	OnError func(http.ResponseWriter, *http.Request, error)
	// Logger receives failed checks and writes that failed after the
	// response was decided, and in dry run the sign-ins it would have
	// refused. Default slog.Default(), taken when New runs.
	Logger *slog.Logger
	// MeterProvider gives the meter of the metrics pglimit.decisions
	// (attributes limit = Name, outcome, scope user) and
	// pglimit.decision.duration (op check: the read or the reservation;
	// op record: a failure's write, a clear, a given-back reservation).
	// Default otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// DryRun decides as usual but refuses nobody: a throttled key's
	// sign-in goes on (its password is checked), is counted with outcome
	// dry-run-refused and logged (at most a line a second); its failure is
	// recorded and its success clears the key's failures, as any other.
	// Default false.
	DryRun bool
	// Exempt, when set, lets a sign-in request for which it returns true
	// through to the handler uncounted: no statement, no reservation, its
	// failure not counted and its key never refused, even when throttled
	// — counted in pglimit.decisions with outcome "exempt". It is the
	// allow list's exemption (middleware/rules.Allowed), as
	// middleware/ratelimit's Options.Exempt. It runs before the body is
	// read and before Key. The handler still finds a Permit in its context
	// (FromContext; Permit.Exempt reports true), whose reports count
	// nothing here but reach a Limiter wrapped around this one; a Limiter
	// inside this one (a username's inside an address's) judges the
	// request as usual. Acquire, which takes a key and no request, never
	// asks it. Default: none is exempt.
	Exempt func(*http.Request) bool
}

// kindSignIn is the Kind of a sign-in refusal: WriteError answers those
// alone as 429 too-many-failed-sign-ins.
const kindSignIn = "signin"

// The scopes of Options.Scope and limit.Refusal.Scope.
const (
	scopeUsername = "username"
	scopeAddress  = "address"
	scopePair     = "pair"
)

// The kinds of scope of the decisions (attribute scope of the metrics): a
// username's are a user's, an address's a key's (as the address rate of
// middleware/ratelimit counts them).
const (
	scopeUser = "user"
	scopeKey  = "key"
)

// Limiter is the failed sign-in throttle. It is safe for concurrent use.
// It decides through internal/throttle and adds what HTTP needs.
type Limiter struct {
	engine *throttle.Limiter
	name   string
	scope  string // Options.Scope
	max    int
	window time.Duration
	strict bool
	key    func(*http.Request) (string, bool) // Options.Key; nil: the default keys
	// username, addrs and devices make the default keys (Options).
	username func(*http.Request) (string, bool)
	addrs    *clientaddr.Resolver
	devices  *Devices
	exempt   func(*http.Request) bool
	maxBody  int64
	onError  func(http.ResponseWriter, *http.Request, error)
	log      *slog.Logger
	// defaultKey: Options.Key was left to the default (Reset normalises).
	defaultKey bool
}

// New returns a Limiter counting failures in pool's database. Every write
// runs on pool itself, never on a transaction, so a failure stays counted
// whatever happens to the request's own transaction. It checks opts and
// starts nothing.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("signin: nil pool")
	}
	kind := scopeUser
	switch opts.Scope {
	case "", scopeUsername:
		opts.Scope = scopeUsername
	case scopeAddress:
		kind = scopeKey
	case scopePair:
		// A pair is a user's, from one client: counted as the user's.
	default:
		return nil, fmt.Errorf("signin: Scope %q: want %q, %q or %q", opts.Scope, scopeUsername, scopePair, scopeAddress)
	}
	if opts.Name == "" {
		opts.Name = map[string]string{scopeUsername: defaultName, scopeAddress: defaultAddressName, scopePair: defaultPairName}[opts.Scope]
	}
	if opts.Limit == 0 {
		opts.Limit = defaultLimit
	}
	if opts.Window == 0 {
		opts.Window = defaultWindow
	}
	if err := errors.Join(vocab.CheckCap("signin", "Limit", opts.Limit), vocab.CheckDuration("signin", "Window", opts.Window)); err != nil {
		return nil, err
	}
	if err := errors.Join(vocab.OrDefault("signin", "MaxBodyBytes", &opts.MaxBodyBytes, defaultMaxBodyBytes),
		vocab.OrDefault("signin", "Timeout", &opts.Timeout, defaultTimeout)); err != nil {
		return nil, err
	}
	defaultKey := opts.Key == nil
	if opts.Username == nil {
		opts.Username = defaultUsername
	}
	if opts.Addresses == nil {
		opts.Addresses = peerAddrs
	}
	if opts.OnError == nil {
		opts.OnError = WriteError
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	engine, err := throttle.New(pool, throttle.Config{Name: opts.Name, Kind: kind, KeepOnSuccess: opts.Scope == scopeAddress,
		Limit: opts.Limit, Window: opts.Window, Strict: !opts.Lenient, Timeout: opts.Timeout,
		Logger: opts.Logger, MeterProvider: opts.MeterProvider, DryRun: opts.DryRun})
	if err != nil {
		return nil, fmt.Errorf("signin: %w", err)
	}
	return &Limiter{
		engine: engine, name: opts.Name, scope: opts.Scope, max: opts.Limit, window: opts.Window, strict: !opts.Lenient,
		key: opts.Key, username: opts.Username, addrs: opts.Addresses, devices: opts.Devices,
		exempt: opts.Exempt, maxBody: opts.MaxBodyBytes, onError: opts.OnError, log: opts.Logger,
		defaultKey: defaultKey,
	}, nil
}

// Flush does nothing and returns nil: every write of the throttle is made
// before the answer. It exists so that every pglimit limiter is shut
// down the same way.
func (l *Limiter) Flush(context.Context) error { return nil }

// ErrInvalidRequest is matched by the error OnError gets for a request
// that carries no key Options.Key can read, or whose body cannot be read
// (other than one too large, a *http.MaxBytesError), and by Acquire's for
// an empty key: WriteError answers 400 invalid-sign-in-request.
var ErrInvalidRequest = errors.New("signin: invalid sign-in request")

var (
	errNoKey      = fmt.Errorf("%w: no key", ErrInvalidRequest)
	errUnreadable = fmt.Errorf("%w: the body cannot be read", ErrInvalidRequest)
)

// ErrNotRecorded is matched by the error OnError gets when the handler
// answered 401 but the failure could not be counted: an uncounted failure
// must not look like a counted one, so WriteError answers 503
// sign-in-unavailable instead of the handler's 401.
var ErrNotRecorded = errors.New("signin: the failed sign-in could not be recorded")

// limitError is the *limit.Refusal of the engine's refusal r.
func (l *Limiter) limitError(r *throttle.Refused) *limit.Refusal {
	return &limit.Refusal{Kind: kindSignIn, Name: l.name, Scope: l.scope, Limit: l.max, Window: l.window, RetryAfter: r.RetryAfter}
}

type outcome int

const (
	pending outcome = iota
	failed
	succeeded
	released
)

// Permit is one sign-in attempt the throttle let through. Report how it
// ended with exactly one of Fail, Succeed or Release; the first report
// counts and later ones do nothing. Its methods are safe for concurrent
// use.
type Permit struct {
	attempt *throttle.Attempt // nil when exempt
	refusal *limit.Refusal    // dry run: the refusal the attempt would have had
	exempt  bool              // Options.Exempt exempted the request: nothing is counted
	// outer is the Permit of the Limiter wrapped around this one's
	// Handler (an address's around a username's): an outcome reported
	// here is reported there too.
	outer *Permit

	mu  sync.Mutex
	out outcome
}

// Refusal is, in dry run, the refusal this sign-in would have had: the key
// is throttled, and the attempt goes on unreserved. Nil when it fits, and
// on a nil Permit.
func (p *Permit) Refusal() *limit.Refusal {
	if p == nil {
		return nil
	}
	return p.refusal
}

// exempted reports whether Options.Exempt exempted this sign-in: the
// Limiter counts none of its outcomes (a Limiter wrapped around it still
// does).
func (p *Permit) exempted() bool { return p != nil && p.exempt }

// Acquire begins a sign-in attempt of key, for callers that are not HTTP
// handlers. It returns a *limit.Refusal (errors.Is pglimit.ErrLimited;
// Kind "signin", Scope Options.Scope, Window Options.Window) when
// the key is throttled; then the password must not be checked. (In dry run
// it returns a Permit instead, whose Refusal says so: the attempt goes on.) Any other
// error is the database's (pglimit.Classify tells a database that cannot
// be reached) or ctx's, and the sign-in must fail (closed). In normal mode
// Acquire is the one read of LoginAttemptGet; in strict mode it is the
// reservation. Report the outcome on the Permit: Fail, Succeed or Release.
func (l *Limiter) Acquire(ctx context.Context, key string) (*Permit, error) {
	if key == "" {
		return nil, errNoKey
	}
	a, err := l.engine.Acquire(ctx, key)
	var r *throttle.Refused
	switch {
	case errors.As(err, &r):
		return nil, l.limitError(r)
	case err != nil:
		return nil, fmt.Errorf("signin: %w", err)
	}
	p := &Permit{attempt: a}
	if r := a.Refusal(); r != nil {
		p.refusal = l.limitError(r)
	}
	return p, nil
}

// Reset clears key's failed sign-ins on every replica: its row in
// login_attempt goes, and every replica forgets the key's refusal within
// about a second (a notification sent after the delete). key is what
// Options.Key returns; for the default keys, the username as the client
// typed it (Reset normalises it as the default key does; with Scope
// "pair", every pair of the username: each address and device it failed
// from), or with Scope "address" the address (or the IPv6 prefix the key
// shows, "2001:db8:1:2::/64"; Reset keys it as the default key does). It
// returns the failures the key had. For an operator who lets a
// locked-out user, or a client address, in.
func (l *Limiter) Reset(ctx context.Context, key string) (int, error) {
	if l.defaultKey {
		key = l.defaultKeyOf(key)
	}
	if key == "" {
		return 0, errNoKey
	}
	var n int
	var err error
	if l.defaultKey && l.scope == scopePair {
		n, err = l.engine.ResetPrefix(ctx, key)
	} else {
		n, err = l.engine.Reset(ctx, key)
	}
	if err != nil {
		return 0, fmt.Errorf("signin: %w", err)
	}
	return n, nil
}

// defaultKeyOf is the default key of what an operator gives Reset: a
// username, or with Scope "address" an address or IPv6 prefix; "" for
// anything else.
func (l *Limiter) defaultKeyOf(s string) string {
	if l.scope != scopeAddress {
		u := NormalizeUsername(s)
		switch {
		case u == "":
			return ""
		case l.scope == scopePair:
			return pairPrefix(u)
		}
		return "username:" + u
	}
	if k := addressOf(l.addrs, s); k != "" {
		return "address:" + k
	}
	return ""
}

// decide sets the outcome once; it reports whether this call set it.
func (p *Permit) decide(o outcome) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.out != pending {
		return false
	}
	p.out = o
	return true
}

// undecide resets an outcome whose write failed, so that it is not taken
// for done.
func (p *Permit) undecide() {
	p.mu.Lock()
	p.out = pending
	p.mu.Unlock()
}

// Fail counts the attempt as a failed sign-in, in a statement of its own
// on the pool (its own transaction), so it is counted whatever becomes of
// the caller's transaction, and even when ctx is already canceled. In
// strict mode the reservation already counted it and nothing is written.
// An error means the failure was not counted: fail the sign-in as if the
// database could not be reached.
func (p *Permit) Fail(ctx context.Context) error {
	return p.report(ctx, failed, (*throttle.Attempt).Fail, (*Permit).Fail)
}

// report reports the outcome o once: on this Limiter's attempt with
// settle (nothing when exempt), then on the outer Permit with outer. A
// failure whose write failed is undecided, so that it is not taken for
// done; a success or release that failed stays decided.
func (p *Permit) report(ctx context.Context, o outcome, settle func(*throttle.Attempt, context.Context) error,
	outer func(*Permit, context.Context) error) error {
	if p == nil || !p.decide(o) {
		return nil
	}
	var err error
	if p.attempt != nil {
		if err = settle(p.attempt, ctx); err != nil {
			if o == failed {
				p.undecide()
			}
			err = fmt.Errorf("signin: %w", err)
		}
	}
	return errors.Join(err, outer(p.outer, ctx))
}

// Succeed clears the key's failures after a successful sign-in: one delete
// when there were failures (or a reservation), nothing otherwise. With
// Scope "address" it clears nothing: it gives back the attempt's own
// reservation (strict), as Release does, and the address keeps its
// failures. An error leaves the failures counted (the safe direction); the
// sign-in itself has succeeded.
func (p *Permit) Succeed(ctx context.Context) error {
	return p.report(ctx, succeeded, (*throttle.Attempt).Succeed, (*Permit).Succeed)
}

// Release ends the attempt as neither a failure nor a success: the request
// was not a sign-in attempt after all (a malformed request, a server
// error), no password was judged. In strict mode the reservation is given
// back (LoginAttemptUnreserve); in normal mode nothing is written. It is
// safe to call after Fail or Succeed (it then does nothing), and more than
// once.
func (p *Permit) Release(ctx context.Context) error {
	return p.report(ctx, released, (*throttle.Attempt).Release, (*Permit).Release)
}

type permitKey struct{}

// FromContext returns the Permit of the sign-in request ctx belongs to; ok
// false for a request the Handler let through unidentified (or one it did
// not wrap): check no password then.
func FromContext(ctx context.Context) (*Permit, bool) {
	p, ok := ctx.Value(permitKey{}).(*Permit)
	return p, ok
}

// newContext returns ctx carrying p.
func newContext(ctx context.Context, p *Permit) context.Context {
	return context.WithValue(ctx, permitKey{}, p)
}

// WriteError answers a failed sign-in request; it is the default
// Options.OnError:
//
//   - *limit.Refusal: 429 too-many-failed-sign-ins with Retry-After and the
//     members limit, retryAfter (seconds) and scope ("username", "pair"
//     or "address"), the same for every username, known or not;
//   - *http.MaxBytesError: 413 sign-in-request-too-large;
//   - clientaddr.ErrUnreadable: 400 client-address-unreadable;
//   - ErrInvalidRequest: 400 invalid-sign-in-request;
//   - ErrNotRecorded, a database that cannot be reached or did not answer
//     in time (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     sign-in-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: the Handler logs before it calls OnError.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		le       *limit.Refusal
		tooLarge *http.MaxBytesError
	)
	switch {
	case errors.As(err, &le) && le.Kind == kindSignIn:
		retry := retryafter.Seconds(le.RetryAfter)
		var detail string
		switch le.Scope {
		case scopeAddress:
			detail = fmt.Sprintf("This client address had %d failed sign-ins over every username; every sign-in from it is refused, whatever the username and password, for %d more seconds.",
				le.Limit, retry)
		case scopePair:
			detail = fmt.Sprintf("This username had %d failed sign-ins from this client; its sign-ins from here are refused, whatever the password, for %d more seconds.",
				le.Limit, retry)
		default:
			detail = fmt.Sprintf("This username had %d failed sign-ins; every sign-in with it is refused, whatever the password, for %d more seconds.",
				le.Limit, retry)
		}
		respond.TooMany(w, r, &problem.Details{
			Slug:       slugTooMany,
			Title:      "Too many failed sign-ins",
			Detail:     detail,
			Extensions: map[string]any{"limit": le.Limit, "retryAfter": retry, "scope": le.Scope},
		}, retry)
	case errors.Is(err, clientaddr.ErrUnreadable):
		respond.BadRequest(w, slugAddress, "Client address unreadable",
			"The request came through a trusted proxy whose forwarded header names no client address.")
	case errors.As(err, &tooLarge):
		problem.Write(w, &problem.Details{Slug: slugTooLarge, Title: "Sign-in request too large",
			Status: http.StatusRequestEntityTooLarge, Detail: "The sign-in request body is too large."})
	case errors.Is(err, errNoKey):
		respond.BadRequest(w, slugInvalid, "Invalid sign-in request",
			"The sign-in request must carry a username: a JSON object or a form with the field \"username\".")
	case errors.Is(err, ErrInvalidRequest):
		respond.BadRequest(w, slugInvalid, "Invalid sign-in request", "The sign-in request body could not be read.")
	case errors.Is(err, ErrNotRecorded):
		respond.Unavailable(w, r, slugUnavailable, detailUnavailable)
	default:
		respond.Error(w, r, err, slugUnavailable, detailUnavailable)
	}
}

// detailUnavailable is the detail of a 503 sign-in-unavailable.
const detailUnavailable = "Sign-in is unavailable: the failed sign-in throttle cannot be reached. Try again shortly."
