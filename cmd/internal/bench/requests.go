package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"

	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// Request is a whole HTTP request through a middleware chain.
const Request Kind = "request"

// Names of the whole-request paths.
const (
	NameRequestAlone    = "request: handler alone"
	NameRequestInflight = "request: in-flight cap"
	NameRequestHeavy    = "request: heavy permit"
	NameRequestAPI      = "request: rate limit + in-flight cap"
	// NameRequestAPIBorrowed is the same chain with the rate limit
	// borrowing (ratelimit.Options.Borrow).
	NameRequestAPIBorrowed = "request: rate limit, borrowed + in-flight cap"
	// NameRequestKept and NameRequestAPIKept are the in-flight cap keeping
	// its slots (inflight.Options.Keep), alone and behind the borrowing
	// rate limit: a steady client's slot is taken from memory.
	NameRequestKept    = "request: in-flight cap, kept"
	NameRequestAPIKept = "request: rate limit, borrowed + in-flight cap, kept"
)

// Requests are whole HTTP requests — a keep-alive client, an httptest
// server, a real pool — through each chain a user would build, beside the
// same handler alone: what a request pays end to end. Each loop is its own
// user and token (the X-Key header), so nothing is refused. Call the
// returned func to stop the servers.
func (s *Suite) Requests() ([]Path, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	key := func(r *http.Request) (string, bool) { k := r.Header.Get("X-Key"); return k, k != "" }
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	flight, err := inflight.New(s.Pool, inflight.Options{Name: "bench-http", Key: key, Replica: "bench", Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	kept, err := inflight.New(s.Pool, inflight.Options{Name: "bench-http-kept", Key: key, Replica: "bench", Keep: time.Second, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	heavyOpts := HeavyEndpoint
	heavyOpts.Name, heavyOpts.Key, heavyOpts.InstallationLimit, heavyOpts.Replica, heavyOpts.Logger = "bench-http", key, 32, "bench", quiet
	hv, err := heavy.New(s.Pool, heavyOpts)
	if err != nil {
		return nil, nil, err
	}
	rlEngine, err := ratelimit.New(s.Pool, ratelimit.Options{Name: "bench-http", Logger: quiet,
		Policies: []ratelimit.Policy{RatePolicies[0]}})
	if err != nil {
		return nil, nil, err
	}
	rl, err := mratelimit.New(mratelimit.Options{Limiter: rlEngine, Key: key, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	rlbEngine, err := ratelimit.New(s.Pool, ratelimit.Options{Name: "bench-http-borrow", Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1_000_000, Window: time.Second}}})
	if err != nil {
		return nil, nil, err
	}
	rlb, err := mratelimit.New(mratelimit.Options{Limiter: rlbEngine, Key: key, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	chains := []struct {
		name, what string
		h          http.Handler
	}{
		{NameRequestAlone, "GET through net/http to a handler writing 3 bytes: the floor of a request", ok},
		{NameRequestInflight, "the same request through inflight.Limiter.Handler: a slot claimed before the handler, released before the answer completes", flight.Handler(ok)},
		{NameRequestHeavy, "the same request through heavy.Limiter.Handler: the user's and the installation's permits claimed, the time bound on the context, both released before the answer completes", hv.Handler(ok)},
		{NameRequestAPI, "the same request through middleware/ratelimit's Handler then inflight.Limiter.Handler, as the reference service's /api/ routes: a rate decision (with its RateLimit headers), a slot claimed and released", rl.Handler(flight.Handler(ok))},
		{NameRequestAPIBorrowed, "the same chain with the rate limit borrowing (Options.Borrow): the rate decision is a unit spent in memory, the slot is claimed and released as above", rlb.Handler(flight.Handler(ok))},
		{NameRequestKept, "the in-flight cap keeping its slots for a second (inflight.Options.Keep): each loop's token is a steady client of this replica, its slot taken from memory and renewed now and then", kept.Handler(ok)},
		{NameRequestAPIKept, "the borrowing rate limit then the in-flight cap keeping its slots: a steady client's whole request with no statement but the occasional borrow and renewal", rlb.Handler(kept.Handler(ok))},
	}
	var servers []*httptest.Server
	stop := func() {
		for _, srv := range servers {
			srv.Close()
		}
		_ = rlbEngine.Flush(context.Background())
		_ = kept.Flush(context.Background())
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, IdleConnTimeout: time.Minute}}
	var paths []Path
	for _, c := range chains {
		srv := httptest.NewServer(c.h)
		servers = append(servers, srv)
		url := srv.URL + "/bench"
		paths = append(paths, Path{Name: c.name, Kind: Request, What: c.what, New: func(w int) (Op, error) {
			k := "http-" + s.run + "-" + strconv.Itoa(w)
			return func(ctx context.Context) error {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
				if err != nil {
					return err
				}
				req.Header.Set("X-Key", k)
				res, err := client.Do(req)
				if err != nil {
					return err
				}
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				if res.StatusCode != http.StatusOK {
					return fmt.Errorf("%s: status %d", url, res.StatusCode)
				}
				return nil
			}, nil
		}})
	}
	return paths, stop, nil
}
