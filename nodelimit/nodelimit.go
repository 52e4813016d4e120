// Package nodelimit keeps the calls that all replicas of a service make to
// a shared upstream node (a broker, a management API, a third-party
// endpoint with a rate of its own) within that node's rate, without a
// database round trip per call. A call is whatever the caller makes after
// one Wait: nodelimit neither knows nor names what it is.
//
// What it guarantees: a node's rate (20 calls per second unless
// Options.Rate or Options.NodeRates say otherwise) is divided by the number
// of ready replicas, rounded up and at least one call per second, and each
// replica spends its share in a token bucket whose burst is one second of
// that share: in any interval of length L, Wait lets at most share +
// share × L calls of one replica go. A call takes its token when Wait
// lets it go, from the bucket as it is then, and none is reserved ahead,
// so the bound holds however late the replica runs: a replica starved of
// CPU while calls wait lets at most a burst go when it runs again, then
// one call per 1/share. The installation's replicas together, each at the
// same ready count, let at most (share × ready) × (1 + L) go in any
// interval L. The ready count comes from
// Options.Replicas (a replica.Registry's ReadyReplicas) and is re-read by
// Run every 5 s by default; when it changes, every node's share follows.
// Until the count has been read (by Run or by Refresh), a replica takes
// itself for the only one.
//
// What it costs: nothing in the database per call — a shared counter would
// cost a round trip per management call, more than it saves — only one
// small read of the replica registry per refresh. A call that waits for its
// turn holds no connection.
//
// How it fails: a call waits for its turn within its context; when the
// context ends first, or its deadline would pass before the turn (known at
// once), Wait returns an error matching ErrNoTurn and the context's error,
// and never hangs. A ready count that cannot be read is logged once and the
// share in use is kept. Because the rate is shared in whole calls per
// second, a rate below the number of ready replicas lets each replica call
// once a second, and the node then sees more than its rate.
//
// Every call that got its turn is counted in the OpenTelemetry counter
// pglimit.nodelimit.calls, without attributes: the limiter's own word that
// it keeps to the rate, readable beside the node's rate by a service that
// counts nothing itself, and the same for every kind of call. What the
// calls are (a search or a read, an endpoint, a node) is the caller's
// vocabulary and belongs in the caller's own metric; the reference
// service, for one, counts its Jolokia calls by kind in
// studio.broker.calls. The counter carries no node name, so its cost does
// not grow with the nodes.
package nodelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/internal/tick"
)

// metricName is the counter every call that got its turn is counted in.
const metricName = "pglimit.nodelimit.calls"

// meterName is the instrumentation scope of the counter.
const meterName = "github.com/pglimit/pglimit/nodelimit"

// defaultRate is a node's rate, in calls per second for the whole
// installation, when Options.Rate is zero.
const defaultRate rate.Limit = 20

// maxRate is the largest finite rate accepted; rate.Inf means no limit.
const maxRate rate.Limit = 1_000_000

// defaultRefresh is how often the ready count is re-read when
// Options.Refresh is zero.
const defaultRefresh = 5 * time.Second

// Options configure a Limiter. The zero value is ready to use: 20 calls per
// second per node, this replica taken for the only one.
type Options struct {
	// Rate is every node's rate in calls per second for the whole
	// installation: a whole number from 1 to 1,000,000, or rate.Inf for no
	// limit. Default 20.
	Rate rate.Limit
	// NodeRates overrides Rate for the nodes it names, with the same rules.
	// Default none.
	NodeRates map[string]rate.Limit
	// Replicas returns the number of ready replicas the rate is divided by
	// (at least 1); pass a *replica.Registry's ReadyReplicas method. It is
	// called by Run and Refresh only, never per call. Default nil: this
	// replica is taken to be the only one.
	Replicas func(ctx context.Context) (int, error)
	// Refresh is how often Run calls Replicas; its first call is made at
	// once. Default 5s.
	Refresh time.Duration
	// MeterProvider provides the counter pglimit.nodelimit.calls. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives failures to read the ready count. Default
	// slog.Default().
	Logger *slog.Logger
}

// Limiter is one replica's limiter of calls to upstream nodes: one token
// bucket per node. It is safe for concurrent use.
type Limiter struct {
	rate      rate.Limit
	nodeRates map[string]rate.Limit
	replicas  func(ctx context.Context) (int, error)
	refresh   time.Duration
	log       *slog.Logger
	counter   metric.Int64Counter

	ready     atomic.Int64 // the ready count in use
	readFails atomic.Bool  // the last read of the ready count failed

	mu    sync.Mutex // guards nodes and the shares of their buckets
	nodes map[string]*Node

	refreshMu sync.Mutex  // one read of the ready count at a time
	ran       atomic.Bool // Run was called
}

// ErrNoTurn is matched (errors.Is) by the error of every call that did not
// get its turn: the caller's context ended first, or its deadline would
// have passed before the turn. The error also matches the context's error
// (context.Canceled or context.DeadlineExceeded) and names the node and the
// replica's share.
var ErrNoTurn = errors.New("nodelimit: the request ended before its turn to call the node")

// waitError is a call that did not get its turn. It unwraps to the
// context's error (context.DeadlineExceeded when the deadline would pass
// before the turn, which Wait knows at once).
type waitError struct {
	node  string
	limit rate.Limit // the replica's share of the node's rate when the call gave up
	err   error      // the context's error
}

func (e *waitError) Error() string {
	return fmt.Sprintf("nodelimit: call to node %q: no turn at %s calls/s before the request ended: %v",
		e.node, formatLimit(e.limit), e.err)
}

// Is reports whether target is ErrNoTurn.
func (e *waitError) Is(target error) bool { return target == ErrNoTurn }

// Unwrap returns the context's error.
func (e *waitError) Unwrap() error { return e.err }

func formatLimit(l rate.Limit) string {
	if l == rate.Inf {
		return "unlimited"
	}
	return fmt.Sprint(float64(l))
}

func checkRate(what string, r rate.Limit) error {
	switch {
	case r == rate.Inf:
		return nil
	case math.IsNaN(float64(r)) || math.IsInf(float64(r), 0):
		return fmt.Errorf("nodelimit: %s %v: not a number of calls per second (rate.Inf means no limit)", what, float64(r))
	case r < 1 || r > maxRate || r != rate.Limit(math.Trunc(float64(r))):
		return fmt.Errorf("nodelimit: %s %v: must be a whole number of calls per second from 1 to %v, or rate.Inf", what, float64(r), float64(maxRate))
	}
	return nil
}

// New returns a Limiter. It checks opts and starts nothing: Run reads the
// ready count in the background.
func New(opts Options) (*Limiter, error) {
	if opts.Rate == 0 {
		opts.Rate = defaultRate
	}
	if err := checkRate("rate", opts.Rate); err != nil {
		return nil, err
	}
	nodeRates := make(map[string]rate.Limit, len(opts.NodeRates))
	for name, r := range opts.NodeRates {
		if name == "" {
			return nil, errors.New("nodelimit: NodeRates names a node with an empty name")
		}
		if err := checkRate(fmt.Sprintf("rate of node %q", name), r); err != nil {
			return nil, err
		}
		nodeRates[name] = r
	}
	if opts.Refresh < 0 {
		return nil, fmt.Errorf("nodelimit: negative refresh %v", opts.Refresh)
	}
	if opts.Refresh == 0 {
		opts.Refresh = defaultRefresh
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	counter, err := opts.MeterProvider.Meter(meterName).Int64Counter(metricName,
		metric.WithDescription("Calls to upstream nodes that got their turn from the node limiter."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("nodelimit: counter %s: %w", metricName, err)
	}
	l := &Limiter{
		rate: opts.Rate, nodeRates: nodeRates, replicas: opts.Replicas, refresh: opts.Refresh,
		log: opts.Logger, counter: counter, nodes: map[string]*Node{},
	}
	l.ready.Store(1)
	return l, nil
}

// errRunTwice is returned by Run when it was called before on the same
// Limiter.
var errRunTwice = errors.New("nodelimit: Run called twice")

// Run reads the ready count at once and then every Refresh, adjusting every
// node's share, until ctx ends; it then returns nil, and the Limiter goes
// on limiting with the last share it had. A failed read is logged (once
// until a read succeeds again) and keeps the share in use. Without
// Options.Replicas it waits for ctx. Run may be called once; a second call
// returns an error at once.
func (l *Limiter) Run(ctx context.Context) error {
	if l.ran.Swap(true) {
		return errRunTwice
	}
	if l.replicas == nil {
		<-ctx.Done()
		return nil
	}
	tick.Every(ctx, l.refresh, func(ctx context.Context) {
		_ = l.Refresh(ctx) // logged; the share in use stays
	})
	return nil
}

// Refresh reads the ready count now and adjusts every node's share when it
// changed. Run calls it every Options.Refresh; a service calls it once
// before it serves, so that its first calls already keep to its share (a
// replica.Registry counts its own replica from New on). On an error the
// share in use stays.
// The read is bounded by ctx and by Refresh (at most 5s).
func (l *Limiter) Refresh(ctx context.Context) error {
	if l.replicas == nil {
		return nil
	}
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, min(l.refresh, 5*time.Second))
	defer cancel()
	n, err := l.replicas(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return err // Run is ending: not a failed read
		}
		if !l.readFails.Swap(true) {
			l.log.Warn("nodelimit: cannot read the ready replicas; keeping the current share",
				"ready", l.ready.Load(), "err", err)
		}
		return fmt.Errorf("nodelimit: ready replicas: %w", err)
	}
	if l.readFails.Swap(false) {
		l.log.Info("nodelimit: ready replicas readable again", "ready", n)
	}
	l.setReady(max(1, n))
	return nil
}

func (l *Limiter) setReady(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.ready.Load() == int64(n) {
		return
	}
	l.ready.Store(int64(n))
	for _, node := range l.nodes {
		node.setShare(share(node.total, n))
	}
}

// readyReplicas is the ready count the shares are computed with.
func (l *Limiter) readyReplicas() int { return int(l.ready.Load()) }

// share is one replica's part of a node's rate total when ready replicas
// are ready: total / ready rounded up, at least 1; rate.Inf stays rate.Inf.
func share(total rate.Limit, ready int) rate.Limit {
	if total == rate.Inf {
		return rate.Inf
	}
	ready = max(1, ready)
	return max(1, rate.Limit(math.Ceil(float64(total)/float64(ready))))
}

// burst is one second of share, at least 1.
func burst(share rate.Limit) int {
	if share == rate.Inf {
		return 1 // ignored by rate.Limiter when the limit is Inf
	}
	return max(1, int(share))
}

// Node returns the limiter of calls to the node called name, created on
// first use with the node's rate (NodeRates[name], else Rate). Every call
// with one name returns the same *Node.
func (l *Limiter) Node(name string) (*Node, error) {
	if name == "" {
		return nil, errors.New("nodelimit: empty node name")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if n, ok := l.nodes[name]; ok {
		return n, nil
	}
	total, ok := l.nodeRates[name]
	if !ok {
		total = l.rate
	}
	s := share(total, int(l.ready.Load()))
	n := &Node{name: name, total: total, l: l, b: newBucket(s, burst(s))}
	l.nodes[name] = n
	return n, nil
}

// Node limits this replica's calls to one upstream node. It is safe for
// concurrent use.
type Node struct {
	name  string
	total rate.Limit
	l     *Limiter
	b     *bucket
}

func (n *Node) setShare(share rate.Limit) { n.b.set(share, burst(share)) }

// rate is the node's rate for the whole installation.
func (n *Node) rate() rate.Limit { return n.total }

// Limit is this replica's share of the node's rate now, in calls per
// second: the node's rate divided by the ready replicas, rounded up, at
// least 1 (rate.Inf when the node has no limit). A replica may also make
// that many calls at once after a quiet second: in any interval of length
// L, at most Limit × (1 + L).
func (n *Node) Limit() rate.Limit {
	l, _ := n.b.get()
	return l
}

// burst is how many calls this replica may make at once after a quiet
// second: one second of its share.
func (n *Node) burst() int {
	_, b := n.b.get()
	return b
}

// Wait waits for this replica's turn to make one call to the node, then
// counts the call in pglimit.nodelimit.calls. Calls of one replica take
// their turns in the order they called Wait. When ctx ends first — or its
// deadline would pass before the turn, which Wait knows at once — it
// returns an error matching ErrNoTurn and the context's error, and the call
// is not counted. Wait makes no database round trip.
func (n *Node) Wait(ctx context.Context) error {
	if err := n.b.wait(ctx); err != nil {
		cause := ctx.Err()
		if cause == nil { // the deadline would pass before the turn
			cause = context.DeadlineExceeded
		}
		return &waitError{node: n.name, limit: n.Limit(), err: cause}
	}
	n.l.counter.Add(ctx, 1)
	return nil
}
