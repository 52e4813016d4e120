// Package signin throttles failed sign-ins across every replica of a service
// (ADR-0196 decision 5), counting them in PostgreSQL's UNLOGGED
// login_attempt table.
//
// # The rule
//
// Failed sign-ins are counted per client key, by default the normalised
// username (trimmed, NFKC, Unicode case-folded). Once a key has
// MaxFailures failures (default 5) in the Window that opened with its first
// failure (default 15 minutes), every sign-in of that key is refused with
// 429 too-many-failed-sign-ins and Retry-After until the window lapses —
// whether the password is right or not. A successful sign-in clears the
// key's failures. The throttle keys on the username alone: it never trusts
// X-Forwarded-For, and a key function of the application's own can add
// other identities.
//
// # Cost (ADR-0196, Consequences)
//
// A sign-in costs one read (LoginAttemptGet). A failed one adds one upsert
// (LoginAttemptRecordFailure): two statements, at most two writes as the ADR
// allows. A success after failures adds one delete (LoginAttemptClear); a
// success with none writes nothing. Every write runs on the pool, as a
// statement of its own — its own transaction, never the request's — so a
// failure is counted even when the handler's transaction rolls back.
//
// # Normal and strict mode
//
// In normal mode the count is read before the password is checked and
// written after, so attempts already in flight when the limit is reached
// are still evaluated: under a burst of concurrent wrong passwords for one
// username more than MaxFailures passwords are checked (the tests measure
// it). Strict mode reserves the attempt atomically before the password is
// checked (LoginAttemptReserve: the attempt counts as a failure up front,
// only while the key is under the limit), so never more than MaxFailures
// passwords are checked per window; it costs one more write on success (the
// reservation, then the clear) and on a request that turns out not to be an
// attempt (the reservation, then LoginAttemptUnreserve).
//
// # A database that cannot be reached
//
// cannot throttle: the sign-in fails closed with 503 sign-in-unavailable and
// the handler never runs. A failure that cannot be recorded turns the
// handler's 401 into the same 503.
//
// # What the application must do
//
//   - Wrap only the sign-in handler with Handler (or call Check and the
//     Attempt's methods from non-HTTP code).
//   - Check credentials in the same way whether the username exists or not:
//     for an unknown username run the password hash comparison against a
//     dummy hash of the same cost (bcrypt.CompareHashAndPassword(dummy,
//     password)) and answer exactly as for a wrong password (401, same body,
//     same headers). The throttle itself treats unknown usernames exactly
//     like known ones — it never looks users up — so its responses and its
//     statements are the same for both.
//   - Say how the attempt ended, either by the status it writes (401: a
//     failed attempt; 2xx: a success; anything else, a panic, or nothing
//     written: not an attempt) or explicitly, before writing, with Failed,
//     Succeeded or Abandoned on the request's context. The first outcome
//     reported counts; the status is only looked at when none was reported.
//     Report explicitly when a handler's own status codes differ.
package signin

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/respond"
	"github.com/pglimit/pglimit/problem"
)

// Problem type slugs of the sign-in throttle.
const (
	// SlugTooMany: the key had too many failed sign-ins in its window (429).
	SlugTooMany = "too-many-failed-sign-ins"
	// SlugUnavailable: the throttle's database cannot be reached (503).
	SlugUnavailable = "sign-in-unavailable"
	// SlugInvalid: no client key could be read from the request (400).
	SlugInvalid = "invalid-sign-in-request"
	// SlugTooLarge: the request body is larger than MaxBodyBytes (413).
	SlugTooLarge = "sign-in-request-too-large"
)

// Defaults of Options.
const (
	DefaultMaxFailures        = 5
	DefaultWindow             = 15 * time.Minute
	DefaultMaxBodyBytes int64 = 64 << 10
)

// maxKeyBytes is the longest key stored as it is; longer keys, and keys that
// PostgreSQL text cannot hold (invalid UTF-8, NUL), are stored as a SHA-256.
const maxKeyBytes = 200

// writeTimeout bounds the writes of an outcome, which outlive the request's
// context (a client that goes away still has its failure counted).
const writeTimeout = 5 * time.Second

// Options configure a Limiter. The zero value is ready to use.
type Options struct {
	// MaxFailures is how many failed sign-ins a key may have in one window;
	// once it has that many, every sign-in of the key is refused until the
	// window lapses. Default 5.
	MaxFailures int
	// Window is how long failures count: the window opens with a key's first
	// failure and lapses Window later (later failures do not extend it).
	// Default 15 minutes.
	Window time.Duration
	// Key returns the client key of a sign-in request. It is given a copy of
	// the request whose body it may read (the handler gets the body again
	// from the start). An error refuses the request with 400
	// invalid-sign-in-request (413 sign-in-request-too-large for a
	// *http.MaxBytesError); the error's text is not sent. Default:
	// UsernameKey, which keys on the username alone and never on
	// X-Forwarded-For.
	Key func(*http.Request) (string, error)
	// MaxBodyBytes bounds the request body Handler buffers for Key and the
	// handler. Default 64 KiB.
	MaxBodyBytes int64
	// Strict reserves each attempt before the password is checked, so that
	// no more than MaxFailures passwords of a key are ever checked in a
	// window, even under concurrent attempts. Default false (read, then
	// write: cheaper, but attempts in flight when the limit is reached are
	// still evaluated).
	Strict bool
	// OnRefused writes the response of a throttled sign-in. Default:
	// WriteRefusal.
	OnRefused func(http.ResponseWriter, *http.Request, *LimitError)
	// Logger receives writes that failed after the response was decided.
	// Default slog.Default().
	Logger *slog.Logger
}

// Limiter is the failed sign-in throttle. It is safe for concurrent use.
type Limiter struct {
	pool      *pgxpool.Pool
	q         *db.Queries
	max       int
	window    time.Duration
	key       func(*http.Request) (string, error)
	maxBody   int64
	strict    bool
	onRefused func(http.ResponseWriter, *http.Request, *LimitError)
	log       *slog.Logger
}

// New returns a Limiter counting failures in pool's database. Every write
// runs on pool itself, never on a transaction, so a failure stays counted
// whatever happens to the request's own transaction.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("signin: nil pool")
	}
	if opts.MaxFailures < 0 || opts.Window < 0 || opts.MaxBodyBytes < 0 {
		return nil, errors.New("signin: negative option")
	}
	if opts.MaxFailures == 0 {
		opts.MaxFailures = DefaultMaxFailures
	}
	if opts.MaxFailures > pglimit.MaxLimit {
		return nil, fmt.Errorf("signin: MaxFailures %d above pglimit.MaxLimit (%d)", opts.MaxFailures, pglimit.MaxLimit)
	}
	if opts.Window == 0 {
		opts.Window = DefaultWindow
	}
	if opts.Window < time.Millisecond {
		return nil, errors.New("signin: Window below a millisecond")
	}
	if opts.MaxBodyBytes == 0 {
		opts.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if opts.Key == nil {
		opts.Key = UsernameKey
	}
	if opts.OnRefused == nil {
		opts.OnRefused = WriteRefusal
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Limiter{
		pool: pool, q: db.New(), max: opts.MaxFailures, window: opts.Window, key: opts.Key,
		maxBody: opts.MaxBodyBytes, strict: opts.Strict, onRefused: opts.OnRefused, log: opts.Logger,
	}, nil
}

// MaxFailures is the number of failures that throttles a key.
func (l *Limiter) MaxFailures() int { return l.max }

// Window is how long failures count.
func (l *Limiter) Window() time.Duration { return l.window }

// Strict reports whether attempts are reserved before they are evaluated.
func (l *Limiter) Strict() bool { return l.strict }

// ErrNoAttempt is returned by Failed, Succeeded and Abandoned when the
// context carries no attempt (the handler is not wrapped by Handler).
var ErrNoAttempt = errors.New("signin: no sign-in attempt in context")

// ErrNoKey is what a key function returns when the request names no
// username.
var ErrNoKey = errors.New("signin: no username in the request")

// LimitError is a throttled sign-in.
type LimitError struct {
	// Limit is the number of failures that throttles a key.
	Limit int
	// Failures is the key's failures in its window.
	Failures int
	// RetryAfter is when the window lapses, on the database clock, at least
	// one second.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("signin: %d failed sign-ins (limit %d); retry in %v", e.Failures, e.Limit, e.RetryAfter)
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == pglimit.ErrLimited }

type outcome int

const (
	pending outcome = iota
	failed
	succeeded
	abandoned
)

// Attempt is one sign-in the throttle let through. Report how it ended with
// exactly one of RecordFailure, Succeeded or Abandon; the first report
// counts and later ones do nothing. Its methods are safe for concurrent
// use.
type Attempt struct {
	l        *Limiter
	key      string
	prior    int32 // live failures the read saw (normal mode)
	reserved bool  // the attempt was reserved (strict mode)

	mu  sync.Mutex
	out outcome
}

// Key returns the attempt's key as stored in login_attempt.
func (a *Attempt) Key() string { return a.key }

// StoredKey is the form of key kept in login_attempt: key itself when it is
// valid UTF-8 without NUL and at most 200 bytes, otherwise "sha256:" and the
// hex digest of key, so that no client input can make the statement fail.
func StoredKey(key string) string {
	if len(key) <= maxKeyBytes && utf8.ValidString(key) && !containsNUL(key) {
		return key
	}
	sum := sha256.Sum256([]byte(key))
	return "sha256:" + hex.EncodeToString(sum[:])
}

func containsNUL(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return true
		}
	}
	return false
}

// Check begins a sign-in attempt of key for callers that are not HTTP
// handlers. It returns a *LimitError (errors.Is pglimit.ErrLimited) when the key
// is throttled; then the password must not be checked. Any other error is
// the database's, and the sign-in must fail (closed): dberr.IsUnavailable
// tells a database that cannot be reached. In normal mode Check is the one
// read of LoginAttemptGet; in strict mode it is the reservation.
func (l *Limiter) Check(ctx context.Context, key string) (*Attempt, error) {
	if key == "" {
		return nil, ErrNoKey
	}
	key = StoredKey(key)
	if l.strict {
		return l.reserve(ctx, key)
	}
	row, err := l.q.LoginAttemptGet(ctx, l.pool, key)
	if errors.Is(err, pgx.ErrNoRows) {
		return &Attempt{l: l, key: key}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("signin: read throttle: %w", err)
	}
	if int(row.Failures) >= l.max {
		return nil, l.limitError(row.Failures, row.RetryMs)
	}
	return &Attempt{l: l, key: key, prior: row.Failures}, nil
}

func (l *Limiter) limitError(failures int32, retryMs int64) *LimitError {
	return &LimitError{Limit: l.max, Failures: int(failures),
		RetryAfter: max(time.Second, time.Duration(retryMs)*time.Millisecond)}
}

// reserve is strict mode's Check: one atomic statement that counts the
// attempt up front only while the key is under the limit.
func (l *Limiter) reserve(ctx context.Context, key string) (*Attempt, error) {
	params := &db.LoginAttemptReserveParams{Key: key, WindowMs: l.window.Milliseconds(), MaxFailures: int32(l.max)}
	for try := 0; ; try++ {
		row, err := l.q.LoginAttemptReserve(ctx, l.pool, params)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("signin: reserve attempt: %w", err)
		}
		if err == nil && row.Reserved {
			return &Attempt{l: l, key: key, reserved: true}, nil
		}
		if err == nil && row.RetryMs > 0 {
			return nil, l.limitError(row.Failures, row.RetryMs)
		}
		// Refused, but the statement's snapshot predates the row that
		// refused it (see LoginAttemptReserve): read it again for when its
		// window ends. If it is gone by now, the key is free: try again.
		got, err := l.q.LoginAttemptGet(ctx, l.pool, key)
		if err == nil && int(got.Failures) >= l.max {
			return nil, l.limitError(got.Failures, got.RetryMs)
		}
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return nil, fmt.Errorf("signin: read throttle: %w", err)
		}
		if try == 2 {
			// The row keeps changing under us; refuse rather than let an
			// unreserved attempt through.
			return nil, l.limitError(int32(l.max), time.Second.Milliseconds())
		}
	}
}

// decide sets the outcome once; it reports whether this call set it.
func (a *Attempt) decide(o outcome) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.out != pending {
		return false
	}
	a.out = o
	return true
}

// undecide resets an outcome whose write failed, so that it is not taken
// for done.
func (a *Attempt) undecide() {
	a.mu.Lock()
	a.out = pending
	a.mu.Unlock()
}

func writeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.WithoutCancel(ctx), writeTimeout)
}

// RecordFailure counts the attempt as a failed sign-in, in a statement of
// its own on the pool (its own transaction), so it is counted whatever
// becomes of the caller's transaction, and even when ctx is already
// canceled. In strict mode the reservation already counted it and nothing
// is written. An error means the failure was not counted: fail the sign-in
// as if the database could not be reached.
func (a *Attempt) RecordFailure(ctx context.Context) error {
	if !a.decide(failed) {
		return nil
	}
	if a.reserved {
		return nil
	}
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	if _, err := a.l.q.LoginAttemptRecordFailure(ctx, a.l.pool, &db.LoginAttemptRecordFailureParams{
		Key: a.key, WindowMs: a.l.window.Milliseconds(),
	}); err != nil {
		a.undecide()
		return fmt.Errorf("signin: record failure: %w", err)
	}
	return nil
}

// Succeeded clears the key's failures after a successful sign-in: one
// delete when there were failures (or a reservation), nothing otherwise. An
// error leaves the failures counted (the safe direction); the sign-in
// itself has succeeded.
func (a *Attempt) Succeeded(ctx context.Context) error {
	if !a.decide(succeeded) {
		return nil
	}
	if !a.reserved && a.prior == 0 {
		return nil
	}
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	if err := a.l.q.LoginAttemptClear(ctx, a.l.pool, a.key); err != nil {
		return fmt.Errorf("signin: clear failures: %w", err)
	}
	return nil
}

// Abandon says the request was not a sign-in attempt after all (a malformed
// request, a server error): no password was judged. In strict mode the
// reservation is given back (LoginAttemptUnreserve); in normal mode nothing
// is written.
func (a *Attempt) Abandon(ctx context.Context) error {
	if !a.decide(abandoned) {
		return nil
	}
	if !a.reserved {
		return nil
	}
	ctx, cancel := writeCtx(ctx)
	defer cancel()
	if err := a.l.q.LoginAttemptUnreserve(ctx, a.l.pool, a.key); err != nil {
		return fmt.Errorf("signin: give back reservation: %w", err)
	}
	return nil
}

// Throttle is the live failures of one key, as operators see them.
type Throttle struct {
	Key       string
	Failures  int
	FirstAt   time.Time
	LastAt    time.Time
	ExpiresAt time.Time
}

// List returns every key with live failures, the most recent window first:
// the operator view. Usernames are in the keys: show it to operators only.
func (l *Limiter) List(ctx context.Context) ([]Throttle, error) {
	rows, err := l.q.LoginAttemptList(ctx, l.pool)
	if err != nil {
		return nil, fmt.Errorf("signin: list: %w", err)
	}
	out := make([]Throttle, len(rows))
	for i, r := range rows {
		out[i] = Throttle{Key: r.Key, Failures: int(r.Failures), FirstAt: r.FirstAt, LastAt: r.LastAt, ExpiresAt: r.ExpiresAt}
	}
	return out, nil
}

type attemptKey struct{}

// FromContext returns the attempt of the sign-in request ctx belongs to.
func FromContext(ctx context.Context) (*Attempt, bool) {
	a, ok := ctx.Value(attemptKey{}).(*Attempt)
	return a, ok
}

// NewContext returns ctx carrying a, for code that calls Check itself and
// hands the attempt down.
func NewContext(ctx context.Context, a *Attempt) context.Context {
	return context.WithValue(ctx, attemptKey{}, a)
}

// Failed records the failed sign-in of ctx's attempt now, in its own
// transaction (see Attempt.RecordFailure). Call it before writing the
// response; the handler may then roll back its own transaction.
func Failed(ctx context.Context) error {
	a, ok := FromContext(ctx)
	if !ok {
		return ErrNoAttempt
	}
	return a.RecordFailure(ctx)
}

// Succeeded reports a successful sign-in of ctx's attempt now (see
// Attempt.Succeeded).
func Succeeded(ctx context.Context) error {
	a, ok := FromContext(ctx)
	if !ok {
		return ErrNoAttempt
	}
	return a.Succeeded(ctx)
}

// Abandoned reports that ctx's request was not a sign-in attempt (see
// Attempt.Abandon).
func Abandoned(ctx context.Context) error {
	a, ok := FromContext(ctx)
	if !ok {
		return ErrNoAttempt
	}
	return a.Abandon(ctx)
}

// WriteRefusal is the default refusal: 429 problem+json
// too-many-failed-sign-ins with Retry-After and the members limit and
// retryAfter (seconds). It says the same for every username, known or not.
func WriteRefusal(w http.ResponseWriter, r *http.Request, e *LimitError) {
	retry := problem.RetryAfterSeconds(e.RetryAfter)
	problem.Write(w, &problem.Details{
		Slug:   SlugTooMany,
		Title:  "Too many failed sign-ins",
		Status: http.StatusTooManyRequests,
		Detail: fmt.Sprintf("This username had %d failed sign-ins; every sign-in with it is refused, whatever the password, for %d more seconds.",
			e.Limit, retry),
		Instance:   r.URL.Path,
		RetryAfter: time.Duration(retry) * time.Second,
		Extensions: map[string]any{"limit": e.Limit, "retryAfter": retry},
	})
}

// detailUnavailable is the detail of a 503 sign-in-unavailable.
const detailUnavailable = "Sign-in is unavailable: the failed sign-in throttle cannot be reached. Try again shortly."

func writeUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	respond.Error(w, r, err, SlugUnavailable, detailUnavailable)
}
