package bench

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"runtime"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/readroute"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
	"github.com/pglimit/pglimit/nodelimit"
)

// AllocsPerRun is the mean number of heap allocations of one call of f,
// over runs calls after one warm-up call, with GOMAXPROCS 1 — the method of
// testing.AllocsPerRun, without importing package testing into a command.
func AllocsPerRun(runs int, f func()) float64 {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	f()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	before := m.Mallocs
	for range runs {
		f()
	}
	runtime.ReadMemStats(&m)
	return float64(m.Mallocs-before) / float64(runs)
}

// AllocCase is one request path whose allocations are counted.
type AllocCase struct {
	// Name names the middleware and path.
	Name string
	// What says what one run does.
	What string
	// Run does one request. It panics on a wrong answer (a bug in the
	// case, found at once).
	Run func()
}

// sink is a ResponseWriter that keeps nothing but the status, so that the
// allocations counted are the middleware's, not a recorder's.
type sink struct {
	h      http.Header
	status int
}

func (s *sink) Header() http.Header         { return s.h }
func (s *sink) Write(p []byte) (int, error) { return len(p), nil }
func (s *sink) WriteHeader(code int)        { s.status = code }
func (s *sink) reset() {
	clear(s.h)
	s.status = 0
}

// body is a request body that can be read again.
type body struct{ *bytes.Reader }

func (body) Close() error { return nil }

func expect(s *sink, status int) {
	if s.status != status {
		panic("bench: status " + http.StatusText(s.status) + ", want " + http.StatusText(status))
	}
}

// NoDBCases are the paths of each middleware that never reach the
// database: a request without an identity (401) or without a sign-in key
// (400), the refusal writer run once the database has said no, the read
// router's choice, the node limiter's call, and the cursor's parse and
// sign. The pools given to the middlewares point at no server and are never
// dialled: a case that reached the database would fail.
func NoDBCases() ([]AllocCase, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nowhere, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err != nil {
		return nil, nil, err
	}
	nowhere2, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:2/none?connect_timeout=1")
	if err != nil {
		return nil, nil, err
	}
	none := func(*http.Request) (string, bool) { return "", false }
	hv, err := heavy.New(nowhere, heavy.Options{Name: "bench", Key: none, InstallationLimit: 4, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	si, err := signin.New(nowhere, signin.Options{Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	up, err := upload.New(nowhere, upload.Options{Key: none, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	fl, err := inflight.New(nowhere, inflight.Options{Key: none, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	rr, err := readroute.New(nowhere, nowhere2, readroute.Options{
		Probe: func(context.Context, *pgxpool.Pool) error { return nil }, Logger: quiet,
	})
	if err != nil {
		return nil, nil, err
	}
	if !rr.Check(context.Background()) {
		return nil, nil, errors.New("readroute: the stand-in probe did not answer")
	}
	nl, err := nodelimit.New(nodelimit.Options{Rate: rate.Inf, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	node, _ := nl.Node("n")
	pager, err := cursor.NewPager(nil, cursor.Rules{})
	if err != nil {
		return nil, nil, err
	}
	cleanup := func() { nowhere.Close(); nowhere2.Close() }

	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })
	routed := rr.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = readroute.Read(r.Context(), func(*pgxpool.Pool, bool) error { return nil })
		w.WriteHeader(http.StatusOK)
	}))
	w := &sink{h: http.Header{}}
	get, _ := http.NewRequest(http.MethodGet, "/api/sql", nil)
	serve := func(h http.Handler, r *http.Request, status int) func() {
		return func() {
			w.reset()
			h.ServeHTTP(w, r)
			expect(w, status)
		}
	}
	heavyH := hv.Handler(ok)
	uploadH := up.Handler(ok)
	flightH := fl.Handler(ok)
	signinH := si.Handler(ok)
	noName := body{bytes.NewReader([]byte(`{"password":"x"}`))}
	post, _ := http.NewRequest(http.MethodPost, "/api/session", noName)
	post.Header.Set("Content-Type", "application/json")
	limitErr := &limit.Refusal{Kind: "heavy", Name: "sql-console", Scope: "user", Limit: 2, RetryAfter: 3 * time.Second}
	pos := cursor.Position{At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), ID: 123456}
	q := map[string][]string{"after": {pager.Next("bench", cursor.Page{Size: 1}, 1, pos)}, "size": {"50"}}
	ctx := context.Background()

	return []AllocCase{
		{Name: "heavy: unidentified (passes)", What: "heavy.Limiter.Handler, request without an identity: passes to next under the time bound, no permit", Run: serve(heavyH, get, http.StatusOK)},
		{Name: "heavy: refusal writer (429)", What: "heavy.WriteError of a *limit.Refusal: problem+json, Retry-After, RateLimit headers",
			Run: func() {
				w.reset()
				heavy.WriteError(w, get, limitErr)
				expect(w, http.StatusTooManyRequests)
			}},
		{Name: "signin: unidentified (400)", What: "signin.Limiter.Handler, JSON body without a username: body buffered, key read, refused 400 invalid-sign-in-request (no password checked uncounted)",
			Run: func() {
				_, _ = noName.Seek(0, io.SeekStart)
				serve(signinH, post, http.StatusBadRequest)()
			}},
		{Name: "upload: unidentified (passes)", What: "upload.Limiter.Handler, request without an identity: passes to next uncounted", Run: serve(uploadH, get, http.StatusOK)},
		{Name: "inflight: unidentified (passes)", What: "inflight.Limiter.Handler, request without a token identity: passes to next uncounted", Run: serve(flightH, get, http.StatusOK)},
		{Name: "readroute: routed (200)", What: "readroute.Router.Handler choosing the healthy replica (no query)", Run: serve(routed, get, http.StatusOK)},
		{Name: "nodelimit: Node.Wait", What: "one call's turn at rate.Inf, counted in pglimit.nodelimit.calls",
			Run: func() {
				if err := node.Wait(ctx); err != nil {
					panic(err)
				}
			}},
		{Name: "cursor: parse + next", What: "cursor.Pager.Parse of an after cursor and Pager.Next signing the next one",
			Run: func() {
				page, err := pager.Parse(q, "bench")
				if err != nil {
					panic(err)
				}
				if pager.Next("bench", page, 50, pos) == "" {
					panic("no next cursor")
				}
			}},
	}, cleanup, nil
}
