// Package upload limits a user's uploads in any rolling window across every
// replica of a service: by default at most 5 uploads per user in any hour.
//
// It is built on permit.Leaser over the UNLOGGED upload_window table. Each
// upload claims one of the user's Limit slots, leased for the Window, and a
// successful upload keeps its slot until the lease lapses. A user never
// holds more than Limit live slots (a claim takes a slot only while fewer
// are live, and the primary key gives each slot one holder) and slots
// lapse on the database clock, so the bound is a true rolling one: at most
// Limit uploads start in any interval of length Window, never the 2×Limit a
// fixed window lets through around its boundary. A refused upload gets 429
// too-many-uploads with Retry-After: when the oldest counted upload leaves
// the window. Acquire counts an upload without HTTP.
//
//	uploads, err := upload.New(pool, upload.Options{Key: userOf, Limit: 5, Window: time.Hour})
//	mux.Handle("POST /api/plugins", uploads.Handler(pluginHandler))
//
// # Which uploads count
//
// An upload counts when the handler answers it with a 2xx status (or
// returns without writing anything, which net/http sends as 200, while the
// client is still there and its body was read without error). Any other
// status (a rejected file: 4xx; a server error: 5xx), a panic, or a client
// that went away before the handler answered gives the slot back at once:
// a rejected upload does not use up the user's allowance. Options.Counts
// replaces the status rule.
//
// # Unidentified requests
//
// A request whose key Options.Key cannot read (ok false, or an empty key)
// passes to next uncounted. A limiter is not an authenticator: put the
// authentication in front of it, or let the upload handler refuse it.
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
// An upload costs one write transaction, the claim (a rejected one a
// second, the give-back). Its slot lives in an UNLOGGED table: a crash of
// the database empties the windows, which lets users upload again (a short
// reprieve). A database that cannot be reached or does not answer within
// Options.Timeout fails the request (503).
//
// A Limiter is safe for concurrent use.
package upload

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync/atomic"
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

// slugTooMany is the problem type slug of a refused upload.
const slugTooMany = "too-many-uploads"

// Options configure a Limiter.
type Options struct {
	// Name is the limit's name: on its slots (endpoint) and in log lines.
	// Default "uploads".
	Name string
	// Key returns the user whose allowance a request counts against. ok
	// false, or an empty key, lets the request pass to next uncounted (see
	// Unidentified requests). Required.
	Key func(*http.Request) (key string, ok bool)
	// Limit is how many uploads a key may make in any Window:
	// 1..pglimit.MaxLimit. Default 5.
	Limit int
	// Window is the length of the rolling window. Default one hour.
	Window time.Duration
	// Counts says whether an upload answered with status counts against the
	// allowance (keeps its slot). Default: 2xx counts, anything else gives
	// the slot back.
	Counts func(status int) bool
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
	// Logger receives failed claims and failures to give a slot back, and
	// in dry run the uploads it would have refused. Default slog.Default(),
	// taken when New runs.
	Logger *slog.Logger
	// MeterProvider gives the meter of the metrics pglimit.decisions
	// (attributes limit = Name, outcome, scope user) and
	// pglimit.decision.duration (op claim, release). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// DryRun decides as usual but refuses nobody: an upload that would
	// have been refused goes on without a slot (the window is full: there
	// is none to take), so it is not counted in the window, as it would
	// not have been with the limit on; it is counted with outcome
	// dry-run-refused and logged (at most a line a second). Uploads that
	// fit take their slots as usual. Default false.
	DryRun bool
}

// scopeUser is the kind of scope of every decision (attribute scope).
const scopeUser = "user"

// kindUpload is the Kind of an upload refusal: WriteError answers those
// alone as 429 too-many-uploads.
const kindUpload = "upload"

// Limiter counts uploads. It is safe for concurrent use.
type Limiter struct {
	core    *slots.Limiter
	limit   int
	window  time.Duration
	key     func(*http.Request) (string, bool)
	counts  func(int) bool
	onError func(http.ResponseWriter, *http.Request, error)
}

// New returns a Limiter keeping its slots in pool's database. It checks
// opts and starts nothing.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if opts.Key == nil {
		return nil, errors.New("upload: Options.Key is required")
	}
	if opts.Name == "" {
		opts.Name = "uploads"
	}
	if opts.Limit == 0 {
		opts.Limit = 5
	}
	if opts.Window == 0 {
		opts.Window = time.Hour
	}
	if err := errors.Join(vocab.CheckCap("upload", "Limit", opts.Limit),
		vocab.CheckDuration("upload", "Window", opts.Window)); err != nil {
		return nil, err
	}
	if opts.Counts == nil {
		opts.Counts = func(status int) bool { return status >= 200 && status < 300 }
	}
	if opts.OnError == nil {
		opts.OnError = WriteError
	}
	cfg := slots.Config{Pkg: "upload", Name: opts.Name, Kind: permit.UploadWindow,
		Scopes: []string{scopeUser}, Replica: opts.Replica, Timeout: opts.Timeout, Logger: opts.Logger,
		MeterProvider: opts.MeterProvider, DryRun: opts.DryRun}
	if err := slots.Check(pool, &cfg); err != nil {
		return nil, err
	}
	core, err := slots.New(pool, cfg)
	if err != nil {
		return nil, err
	}
	return &Limiter{core: core, limit: opts.Limit, window: opts.Window, key: opts.Key, counts: opts.Counts,
		onError: opts.OnError}, nil
}

// scopeOf is the scope key of key's slots in upload_window.
func scopeOf(key string) string { return permit.ScopeKey("upload", key) }

// Acquire counts an upload of key, for callers that are not HTTP handlers.
// It returns a *limit.Refusal (errors.Is pglimit.ErrLimited; Kind
// "upload", Scope "user", Window the window) when the key has Limit
// uploads in the window already — in dry run a Permit without a slot
// instead, whose Refusal says so; any other error is the database's
// (pglimit.Classify) or ctx's. Keeping the upload counted needs nothing:
// its slot lapses on its own when it leaves the window. Release the
// permit only if the upload fails and must not count.
func (l *Limiter) Acquire(ctx context.Context, key string) (*limit.Permit, error) {
	held, refusal, err := l.acquire(ctx, key)
	if err != nil {
		return nil, err
	}
	return limit.NewPermit(held.ReleaseFunc(), refusal), nil
}

// acquire counts an upload of key: held, or in dry run the refusal let
// through; a refusal is the error otherwise.
func (l *Limiter) acquire(ctx context.Context, key string) (slots.Held, *limit.Refusal, error) {
	held, refused, letThrough, err := l.core.Claim(ctx, key, permit.Claim{
		Scopes: []permit.Scope{{Key: scopeOf(key), Cap: l.limit, Kind: scopeUser}},
		Holder: key, Endpoint: l.core.Name, Lease: l.window,
	}, "cap", l.limit)
	return slots.Outcome(held, refused, letThrough, err, func(r *slots.Refused) *limit.Refusal {
		// The first lapse is measured from the statement's transaction
		// start, which a claim committed just before it can follow by a few
		// milliseconds: no upload counted lapses later than a window from
		// now.
		return &limit.Refusal{Kind: kindUpload, Name: l.core.Name, Scope: scopeUser, Limit: l.limit, Window: l.window,
			RetryAfter: min(slots.RetryAfter(r, 0), l.window)}
	})
}

// Flush waits until every slot given back so far has reached the database.
// Call it at shutdown, after the server stopped serving, so that no
// give-back is lost with the process.
func (l *Limiter) Flush(ctx context.Context) error { return l.core.Flush(ctx) }

// Handler counts every request to next as an upload of its key: it claims
// a slot first (429 when the key has none left), and gives it back when
// the upload does not count (see the package documentation). An
// unidentified request passes to next uncounted.
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, ok := l.key(r)
		if !ok || key == "" {
			next.ServeHTTP(w, r)
			return
		}
		slot, _, err := l.acquire(r.Context(), key)
		if err != nil {
			l.core.Failed(r.Context(), err)
			l.onError(w, r, err)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		rb := r.Body
		if rb == nil {
			rb = http.NoBody
		}
		body := &bodyReader{ReadCloser: rb}
		actx := slots.Answer(r.Context())
		req := r.WithContext(actx) // a copy: r itself is never changed
		req.Body = body
		keep := false
		defer func() {
			if keep {
				return
			}
			// The answer completes once the slot is back, while the
			// database answers within Options.Timeout; a failure is logged
			// by the Leaser.
			slot.ReleaseBeforeAnswer(actx)
		}()
		next.ServeHTTP(sw, req)
		// Only reached when next returned (no panic).
		if sw.status == 0 {
			// Nothing written: net/http answers 200, unless the client went
			// away (its context ended, or reading its upload failed).
			keep = r.Context().Err() == nil && !body.failed.Load() && l.counts(http.StatusOK)
			return
		}
		keep = l.counts(sw.status)
	})
}

// bodyReader notes a failed read of the request body: the client went away
// in the middle of its upload.
type bodyReader struct {
	io.ReadCloser
	failed atomic.Bool
}

func (b *bodyReader) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && err != io.EOF {
		b.failed.Store(true)
	}
	return n, err
}

// statusWriter remembers the first final status the handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

// Unwrap returns the wrapped ResponseWriter (for http.ResponseController).
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 && code >= 200 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	return w.ResponseWriter.Write(b)
}

// Flush flushes the wrapped writer, if it can.
func (w *statusWriter) Flush() {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = http.NewResponseController(w.ResponseWriter).Flush()
}

// formatWindow names a window the way refusals do: "hour", "2 hours",
// "15 minutes", "2 seconds", or as Go writes a duration ("1.5s").
func formatWindow(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}} {
		if d >= u.d && d%u.d == 0 {
			if n := d / u.d; n > 1 {
				return fmt.Sprintf("%d %ss", n, u.name)
			}
			return u.name
		}
	}
	return d.String()
}

// WriteError answers a failed upload request; it is the default
// Options.OnError:
//
//   - *limit.Refusal: 429 too-many-uploads with Retry-After and the members
//     limit and retryAfter (seconds);
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     database-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: the Handler logs before it calls OnError.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	e := respond.Refusal(w, r, err, kindUpload)
	if e == nil {
		return
	}
	retry := retryafter.Seconds(e.RetryAfter)
	respond.TooMany(w, r, &problem.Details{
		Slug:  slugTooMany,
		Title: "Too many uploads",
		Detail: fmt.Sprintf("You made %d uploads in the last %s, your limit; the oldest of them leaves the window in %d seconds.",
			e.Limit, formatWindow(e.Window), retry),
		Extensions: map[string]any{"limit": e.Limit, "retryAfter": retry},
	}, retry)
}
