// Package readroute sends the heavy history reads of a service to a read
// replica while it answers, and to the primary otherwise.
//
// A Router holds the primary pool and an optional replica pool. Its
// Handler wraps the endpoints whose reads may be served by the replica
// (audit, event and alert history, the audit export); a wrapped handler
// runs its read through Read and says in its response whether the replica
// served it:
//
//	mayLag, err := readroute.Read(ctx, func(pool *pgxpool.Pool, _ bool) error {
//		rows, err = queries.EventPage(ctx, pool, ...)
//		return err
//	})
//	...
//	json.NewEncoder(w).Encode(Response{Items: rows, MayLag: mayLag})
//
// A replica sees committed data a little late, so a response it served
// carries "mayLag": true, and the UI shows a short notice. With a heavy
// endpoint's time bound, nest the bounded read inside Read:
//
//	mayLag, err := readroute.Read(ctx, func(pool *pgxpool.Pool, _ bool) error {
//		return heavy.Read(ctx, pool, func(tx pgx.Tx) error { ... })
//	})
//
// Work outside HTTP (a job, a CLI) calls Router.Read instead.
//
// # What it guarantees
//
// A replica that is down, not yet checked, or lost in the middle of a read
// never fails a request the primary can serve: a read through Read that
// finds the replica unreachable (a connection-class error,
// pglimit.ClassUnavailable) marks it down at once and runs again, once, on
// the primary; so does a read the replica canceled for a conflict with the
// WAL it replays (the replica stays up). Any other error is the read's own
// and is returned as it is. mayLag is true exactly when the replica served
// a read of the request. A replica that was promoted (no longer in
// recovery) is still read: the check only requires that it answers.
//
// Run, in the background, pings the replica at once and then every
// Options.Interval with a short Options.Timeout, until its context ends.
// While the replica answers, reads go to it; before the first ping
// answers, when a ping fails, and after Run has returned, reads go to the
// primary (mayLag false) until a ping answers again.
//
// # What is never read on the replica
//
// The limit tables (heavy_permit, request_in_flight, upload_window,
// login_attempt) are UNLOGGED, and UNLOGGED tables are not replicated: on a
// replica they are empty, or an error. Permits, throttles and counters are
// always claimed and read on the primary (middleware/heavy and the others
// are given the primary pool), and the Router hands out the replica only to
// the handlers it wraps. Wrap only handlers that read domain history, never
// one that writes or reads a limit table.
//
// # What it costs
//
// Nothing on the request path touches the database: the health is read
// from memory, and the Handler adds a copy of the request with a new
// context (BenchmarkHandler measures it against the bare handler; see
// BENCHMARKS.md in the repository). The checks cost one SELECT 1 on the
// replica per Interval. A read that falls back runs twice, so fn must not
// have written to the client before it returns an error.
//
// Every Read is counted in the metric pglimit.readroute.reads, attribute
// target: replica (the replica served it), primary (no replica, or it was
// not healthy) or fallback (it failed on the replica and ran again on the
// primary).
//
// A Router is safe for concurrent use.
package readroute

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/session"
	"github.com/pglimit/pglimit/internal/tick"
	"github.com/pglimit/pglimit/internal/vocab"
)

// Defaults of Options.
const (
	defaultInterval = time.Second
	defaultTimeout  = 500 * time.Millisecond
)

// Options configure a Router.
type Options struct {
	// Interval is the time between two health checks of the replica.
	// Default 1s.
	Interval time.Duration
	// Timeout bounds one health check, connecting included. Default 500ms.
	// Checks never overlap: one that outlasts Interval delays the next.
	Timeout time.Duration
	// Probe checks the replica: a nil error means it may be read. Default:
	// one SELECT 1 on the replica pool.
	Probe func(ctx context.Context, replica *pgxpool.Pool) error
	// Logger receives the replica's health changes. Default slog.Default().
	Logger *slog.Logger
	// MeterProvider gives the meter of the counter pglimit.readroute.reads
	// (attribute target: replica, primary, fallback). Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// metricReads counts the reads run through Read, by the attribute target
// (see the package doc).
const metricReads = "pglimit.readroute.reads"

// Targets of metricReads.
const (
	targetReplica  = "replica"
	targetPrimary  = "primary"
	targetFallback = "fallback"
)

// Router chooses the pool each wrapped request reads with. It is safe for
// concurrent use.
type Router struct {
	primary, replica *pgxpool.Pool
	interval         time.Duration
	timeout          time.Duration
	probe            func(context.Context, *pgxpool.Pool) error
	log              *slog.Logger
	reads            metric.Int64Counter
	targets          map[string]metric.AddOption

	healthy atomic.Bool
	ran     atomic.Bool // Run was called
}

// New returns a Router reading from replica when it is healthy and from
// primary otherwise. replica may be nil: every read then goes to the
// primary. It checks opts and starts nothing: until Run has checked the
// replica, reads go to the primary. The Router does not own the pools:
// close them after Run has returned.
func New(primary, replica *pgxpool.Pool, opts Options) (*Router, error) {
	if primary == nil {
		return nil, errors.New("readroute: nil primary pool")
	}
	if err := errors.Join(vocab.OrDefault("readroute", "Interval", &opts.Interval, defaultInterval),
		vocab.OrDefault("readroute", "Timeout", &opts.Timeout, defaultTimeout)); err != nil {
		return nil, err
	}
	if opts.Probe == nil {
		opts.Probe = ping
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	reads, err := observe.Counter(opts.MeterProvider, "github.com/pglimit/pglimit/middleware/readroute", metricReads,
		"History reads run through readroute.Read, by the pool that served them.", "{read}")
	if err != nil {
		return nil, fmt.Errorf("readroute: %w", err)
	}
	targets := map[string]metric.AddOption{}
	for _, t := range []string{targetReplica, targetPrimary, targetFallback} {
		targets[t] = metric.WithAttributeSet(attribute.NewSet(attribute.String("target", t)))
	}
	return &Router{primary: primary, replica: replica, interval: opts.Interval, timeout: opts.Timeout,
		probe: opts.Probe, log: opts.Logger, reads: reads, targets: targets}, nil
}

// counted counts one read served by target.
func (r *Router) counted(ctx context.Context, target string) {
	r.reads.Add(context.WithoutCancel(ctx), 1, r.targets[target])
}

func ping(ctx context.Context, replica *pgxpool.Pool) error { return session.Ping(ctx, replica) }

// errRunTwice is returned by Run when it was called before on the same
// Router.
var errRunTwice = errors.New("readroute: Run called twice")

// Run checks the replica at once and then every Interval (checks never
// overlap), until ctx ends; it then marks the replica not healthy, so reads
// go to the primary, and returns nil. Without a replica it waits for ctx.
// Run may be called once; a second call returns an error at once.
func (r *Router) Run(ctx context.Context) error {
	if r.ran.Swap(true) {
		return errRunTwice
	}
	defer r.healthy.Store(false)
	if r.replica == nil {
		<-ctx.Done()
		return nil
	}
	tick.Every(ctx, r.interval, func(ctx context.Context) { r.check(ctx) })
	return nil
}

// Check probes the replica now, as Run does, records the result and
// reports whether the replica may be read: a caller that cannot wait for
// Run's first check (a test, a start-up that wants reads on the replica at
// once) calls it first. Without a replica it reports false.
func (r *Router) Check(ctx context.Context) bool {
	if r.replica == nil {
		return false
	}
	return r.check(ctx)
}

func (r *Router) check(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	err := r.probe(ctx, r.replica)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		// Run is ending (or the caller went away), not a failed check.
		return r.healthy.Load()
	}
	r.setHealthy(err == nil, err)
	return err == nil
}

func (r *Router) setHealthy(ok bool, err error) {
	if r.healthy.Swap(ok) == ok {
		return
	}
	if ok {
		r.log.Info("readroute: replica answers; history reads go to it")
	} else {
		r.log.Warn("readroute: replica does not answer; history reads go to the primary", "err", err)
	}
}

// Healthy reports whether a replica is configured and answered its last
// check, i.e. whether reads go to it now. It reads memory only, for /readyz
// or an operator view. A replica that is down does not make the service
// unready: reads fall back to the primary.
func (r *Router) Healthy() bool { return r.replica != nil && r.healthy.Load() }

// route is the read route of one request.
type route struct {
	router *Router

	mu      sync.Mutex
	pool    *pgxpool.Pool
	replica bool // pool is the replica
	lagged  bool // the replica served a read of this request
}

type routeKey struct{}

// newContext returns ctx carrying a read route chosen now: the replica
// when it is healthy, else the primary.
func (r *Router) newContext(ctx context.Context) context.Context {
	rt := &route{router: r, pool: r.primary}
	if r.Healthy() {
		rt.pool, rt.replica = r.replica, true
	}
	return context.WithValue(ctx, routeKey{}, rt)
}

// Handler chooses the pool for each request of next, from memory, and
// passes it in the request's context, where Read finds it. The
// incoming request is not changed: next gets a copy.
func (r *Router) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		next.ServeHTTP(w, req.WithContext(r.newContext(req.Context())))
	})
}

func routeOf(ctx context.Context) *route {
	rt, _ := ctx.Value(routeKey{}).(*route)
	return rt
}

// mayLag reports whether the replica served a read of the request of rt.
func (rt *route) mayLag() bool {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.lagged
}

// errNoRoute is returned by Read outside a request wrapped by a Router's
// Handler.
var errNoRoute = errors.New("readroute: no read route in the context")

// Read runs fn with the pool the request of ctx reads with. When fn fails
// on the replica with a connection-class error (pglimit.ClassUnavailable),
// the replica is marked down, the request moves to the primary for good,
// and fn runs once more there with mayLag false: a read that races the
// health check still succeeds. A read the replica canceled for a conflict
// with recovery runs again on the primary too, leaving the replica
// healthy. fn may therefore run twice; it must not have written to the
// client before it returns an error. Read reports whether the replica
// served a read of the request, this one or an earlier one: put it in the
// response as "mayLag". Outside a request wrapped by a Router's Handler,
// Read runs nothing and returns an error.
func Read(ctx context.Context, fn func(pool *pgxpool.Pool, mayLag bool) error) (mayLag bool, err error) {
	rt := routeOf(ctx)
	if rt == nil {
		return false, errNoRoute
	}
	err = rt.read(ctx, fn)
	return rt.mayLag(), err
}

// read runs fn on the pool of rt, falling back to the primary (Read).
func (rt *route) read(ctx context.Context, fn func(pool *pgxpool.Pool, mayLag bool) error) error {
	rt.mu.Lock()
	pool, replica := rt.pool, rt.replica
	rt.mu.Unlock()
	err := fn(pool, replica)
	if !replica {
		rt.router.counted(ctx, targetPrimary)
		return err
	}
	if err == nil {
		rt.mu.Lock()
		rt.lagged = true
		rt.mu.Unlock()
		rt.router.counted(ctx, targetReplica)
		return nil
	}
	if !rt.router.shouldFallBack(ctx, err) {
		rt.router.counted(ctx, targetReplica)
		return err
	}
	rt.mu.Lock()
	rt.pool, rt.replica = rt.router.primary, false
	rt.mu.Unlock()
	rt.router.counted(ctx, targetFallback)
	return fn(rt.router.primary, false)
}

// Read runs fn with the pool a wrapped request would read with now (the
// replica when it is healthy, else the primary), for callers outside a
// wrapped request, and falls back to the primary as the package-level Read
// does. It reports whether the replica served the read.
func (r *Router) Read(ctx context.Context, fn func(pool *pgxpool.Pool, mayLag bool) error) (mayLag bool, err error) {
	return Read(r.newContext(ctx), fn)
}

// shouldFallBack reports whether a read that failed on the replica should
// run again on the primary: when the replica cannot be reached (it is then
// marked down) or canceled the read for a conflict with recovery.
func (r *Router) shouldFallBack(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if dberr.IsRecoveryConflict(err) {
		// The replica is fine; this read collided with the WAL it replays.
		return true
	}
	if !dberr.IsUnavailable(err) {
		return false
	}
	r.setHealthy(false, err)
	return true
}
