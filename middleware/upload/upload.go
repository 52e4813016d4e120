// Package upload limits a user's uploads in any rolling window across every
// replica of a service (ADR-0196 decision 5): by default at most 5 uploads
// per user in any hour.
//
// It is built on permit.Leaser over the UNLOGGED upload_window table. Each
// upload claims one of the user's Limit slots, leased for the Window, and a
// successful upload keeps its slot until the lease lapses. Slots are
// claimed one at a time per user (the permit claim's advisory lock) and
// lapse on the database clock, so the bound is a true rolling one: at most
// Limit uploads start in any interval of length Window, never the 2×Limit a
// fixed window lets through around its boundary. A refused upload gets 429
// too-many-uploads with Retry-After: when the oldest counted upload leaves
// the window.
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

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/respond"
	"github.com/pglimit/pglimit/permit"
	"github.com/pglimit/pglimit/problem"
)

// SlugTooMany is the problem type slug of a refused upload.
const SlugTooMany = "too-many-uploads"

// Defaults of Options.
const (
	DefaultLimit  = 5
	DefaultWindow = time.Hour
)

// Options configure a Limiter.
type Options struct {
	// User returns the user whose allowance a request counts against; ok
	// false refuses the request with 401. Required.
	User func(*http.Request) (user string, ok bool)
	// Limit is how many uploads a user may make in any Window. Default 5.
	Limit int
	// Window is the length of the rolling window. Default one hour.
	Window time.Duration
	// Counts says whether an upload answered with status counts against the
	// allowance (keeps its slot). Default: 2xx counts, anything else gives
	// the slot back.
	Counts func(status int) bool
	// Replica names this replica on its rows. Default host:pid.
	Replica string
	// OnRefused writes the response of a refused upload. Default:
	// WriteRefusal.
	OnRefused func(http.ResponseWriter, *http.Request, *LimitError)
	// Logger receives failures to give a slot back. Default slog.Default().
	Logger *slog.Logger
}

// Limiter counts uploads. It is safe for concurrent use.
type Limiter struct {
	leaser    *permit.Leaser
	limit     int
	window    time.Duration
	user      func(*http.Request) (string, bool)
	counts    func(int) bool
	onRefused func(http.ResponseWriter, *http.Request, *LimitError)
	log       *slog.Logger
}

// New returns a Limiter keeping its slots in pool's database.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("upload: nil pool")
	}
	if opts.User == nil {
		return nil, errors.New("upload: Options.User is required")
	}
	if opts.Limit < 0 || opts.Window < 0 {
		return nil, errors.New("upload: negative Limit or Window")
	}
	if opts.Limit == 0 {
		opts.Limit = DefaultLimit
	}
	if opts.Limit > pglimit.MaxLimit {
		return nil, fmt.Errorf("upload: Limit %d above pglimit.MaxLimit (%d)", opts.Limit, pglimit.MaxLimit)
	}
	if opts.Window == 0 {
		opts.Window = DefaultWindow
	}
	if opts.Window < time.Millisecond {
		return nil, errors.New("upload: Window below a millisecond")
	}
	if opts.Counts == nil {
		opts.Counts = func(status int) bool { return status >= 200 && status < 300 }
	}
	if opts.OnRefused == nil {
		opts.OnRefused = WriteRefusal
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	leaser, err := permit.New(pool, permit.Options{Kind: permit.UploadWindow, Replica: opts.Replica})
	if err != nil {
		return nil, err
	}
	return &Limiter{leaser: leaser, limit: opts.Limit, window: opts.Window, user: opts.User,
		counts: opts.Counts, onRefused: opts.OnRefused, log: opts.Logger}, nil
}

// Limit is the number of uploads allowed in any window.
func (l *Limiter) Limit() int { return l.limit }

// Window is the length of the rolling window.
func (l *Limiter) Window() time.Duration { return l.window }

// Scope is the scope key of user's slots in upload_window.
func Scope(user string) string { return permit.ScopeKey("upload", user) }

// LimitError is a refused upload.
type LimitError struct {
	// Limit is the number of uploads allowed in any window.
	Limit int
	// Window is the length of the rolling window.
	Window time.Duration
	// RetryAfter is when the oldest upload counted leaves the window, on
	// the database clock, at least one second.
	RetryAfter time.Duration
}

func (e *LimitError) Error() string {
	return fmt.Sprintf("upload: %d uploads in the window already; retry in %v", e.Limit, e.RetryAfter)
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == pglimit.ErrLimited }

// Slot is one upload counted in a user's window.
type Slot struct {
	lease *permit.Lease
}

// Release gives the slot back: the upload failed and must not count. It
// outlives a canceled ctx. Keeping a slot needs nothing: it lapses on its
// own when it leaves the window.
func (s *Slot) Release(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return s.lease.Release(ctx)
}

// Claim counts an upload of user, for callers that are not HTTP handlers.
// It returns a *LimitError when the user has Limit uploads in the window
// already. Release the slot if the upload fails.
func (l *Limiter) Claim(ctx context.Context, user string) (*Slot, error) {
	if user == "" {
		return nil, errors.New("upload: empty user")
	}
	lease, err := l.leaser.Claim(ctx, permit.Claim{
		Scopes: []permit.Scope{{Key: Scope(user), Cap: l.limit}},
		Holder: user, Endpoint: "upload", Lease: l.window,
	})
	if err != nil {
		var refused *permit.RefusedError
		if errors.As(err, &refused) {
			return nil, &LimitError{Limit: l.limit, Window: l.window, RetryAfter: max(time.Second, refused.FirstLapse)}
		}
		return nil, err
	}
	return &Slot{lease: lease}, nil
}

// Handler counts every request to next as an upload of its user: it claims
// a slot first (429 when the user has none left), and gives it back when
// the upload does not count (see the package documentation).
func (l *Limiter) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		user, ok := l.user(r)
		if !ok || user == "" {
			problem.Write(w, &problem.Details{Slug: "unauthorized", Title: "Unauthorized", Status: http.StatusUnauthorized,
				Detail: "Uploading needs an authenticated user."})
			return
		}
		slot, err := l.Claim(r.Context(), user)
		if err != nil {
			var le *LimitError
			if errors.As(err, &le) {
				l.onRefused(w, r, le)
			} else {
				respond.Log(r.Context(), l.log, "upload: claim failed", err)
				respond.Database(w, r, err)
			}
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		rb := r.Body
		if rb == nil {
			rb = http.NoBody
		}
		body := &bodyReader{ReadCloser: rb}
		req := r.WithContext(r.Context()) // a copy: r itself is never changed
		req.Body = body
		keep := false
		defer func() {
			if keep {
				return
			}
			if err := slot.Release(r.Context()); err != nil {
				l.log.WarnContext(r.Context(), "upload: giving back the slot of an upload that did not count failed; it lapses with the window",
					"user", user, "err", err)
			}
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

// FormatWindow names a window the way refusals do: "hour", "2 hours",
// "15 minutes", "2 seconds", or as Go writes a duration ("1.5s").
func FormatWindow(d time.Duration) string {
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

// WriteRefusal is the default refusal: 429 problem+json too-many-uploads
// with Retry-After and the members limit and retryAfter (seconds).
func WriteRefusal(w http.ResponseWriter, r *http.Request, e *LimitError) {
	retry := problem.RetryAfterSeconds(e.RetryAfter)
	problem.Write(w, &problem.Details{
		Slug:   SlugTooMany,
		Title:  "Too many uploads",
		Status: http.StatusTooManyRequests,
		Detail: fmt.Sprintf("You made %d uploads in the last %s, your limit; the oldest of them leaves the window in %d seconds.",
			e.Limit, FormatWindow(e.Window), retry),
		Instance:   r.URL.Path,
		RetryAfter: time.Duration(retry) * time.Second,
		Extensions: map[string]any{"limit": e.Limit, "retryAfter": retry},
	})
}
