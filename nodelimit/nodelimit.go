// Package nodelimit limits the calls one replica makes to broker nodes, so
// that all replicas together keep to a node's configured rate (ADR-0196
// decision 6).
//
// The installation's rate for a node (by default 20 calls per second) is
// divided by the number of ready replicas, rounded up and at least one: each
// replica takes that share in a golang.org/x/time/rate token bucket whose
// burst is one second of its share. Nothing is counted in the database per
// call — a round trip per management call would cost more than it saves.
// The ready count comes from the replica registry (package replica, through
// the ReadyCounter interface), re-read every 5 s by default while Run runs
// in the background, and every node's share is adjusted when it changes.
// New starts nothing; until Run (or a Refresh) has read the count, each
// replica takes itself for the only one.
//
// Because the rate is shared in whole calls per second, a rate below the
// number of ready replicas lets each replica call once a second and the
// node sees more than its rate; that is the ADR's stated consequence.
//
// Every call let through is counted in the OpenTelemetry counter
// studio.broker.calls with the attribute kind (search or read). A call
// waits for its turn within its context; when the context ends first, Wait
// fails at once with an error matching ErrNoTurn, never hangs. ReadAll sends
// a long list of reads in batches of at most 200, one call each, keeping the
// order of the results (the ADR's BrokerListOps.readAll).
//
// The reference service's Jolokia client, which makes its calls through a
// Node, and a stand-in broker node for tests and demos live with the
// service (cmd/studio, cmd/fakenode), not in the library.
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
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"
)

// Kind is the kind of a broker call, the value of the metric's kind
// attribute.
type Kind string

const (
	// KindSearch is a search for MBean names.
	KindSearch Kind = "search"
	// KindRead is a read of MBean attributes.
	KindRead Kind = "read"
)

// MetricName is the counter every call is counted in.
const MetricName = "studio.broker.calls"

// MeterName is the instrumentation scope of the counter.
const MeterName = "github.com/pglimit/pglimit/nodelimit"

// DefaultRate is a node's rate, in calls per second for the whole
// installation, when Options.Rate is zero.
const DefaultRate rate.Limit = 20

// MaxRate is the largest finite rate accepted; use rate.Inf for no limit.
const MaxRate rate.Limit = 1_000_000

// DefaultRefresh is how often the ready count is re-read when
// Options.Refresh is zero.
const DefaultRefresh = 5 * time.Second

// BatchSize is the most reads ReadAll sends in one call.
const BatchSize = 200

// ReadyCounter reports the number of ready replicas of the installation,
// at least 1. *replica.Registry implements it.
type ReadyCounter interface {
	ReadyReplicas(ctx context.Context) (int, error)
}

// Options configure a Limiter.
type Options struct {
	// Rate is every node's rate in calls per second for the whole
	// installation: a whole number from 1 to MaxRate, or rate.Inf for no
	// limit. Default DefaultRate (20).
	Rate rate.Limit
	// NodeRates overrides Rate for the nodes it names, with the same rules.
	// Default none.
	NodeRates map[string]rate.Limit
	// Replicas gives the number of ready replicas the rate is divided by.
	// Default nil: this replica is taken to be the only one.
	Replicas ReadyCounter
	// Refresh is how often Run reads Replicas; its first read is made at
	// once. Default 5s.
	Refresh time.Duration
	// MeterProvider provides the studio.broker.calls counter. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// Logger receives failures to read the ready count. Default
	// slog.Default().
	Logger *slog.Logger
}

// Limiter is one replica's limiter of calls to broker nodes: one token
// bucket per node. It is safe for concurrent use.
type Limiter struct {
	rate      rate.Limit
	nodeRates map[string]rate.Limit
	replicas  ReadyCounter
	refresh   time.Duration
	log       *slog.Logger
	counter   metric.Int64Counter
	addSearch []metric.AddOption
	addRead   []metric.AddOption

	ready     atomic.Int64 // the ready count in use
	readFails atomic.Bool  // the last read of the ready count failed

	mu    sync.Mutex // guards nodes and the shares of their buckets
	nodes map[string]*Node

	refreshMu sync.Mutex  // one read of the ready count at a time
	ran       atomic.Bool // Run was called
}

// ErrNoTurn is matched (errors.Is) by every *WaitError: the caller's
// context ended before its turn to call the node came.
var ErrNoTurn = errors.New("nodelimit: the request ended before its turn to call the broker node")

// WaitError is a call that did not get its turn. It unwraps to the
// context's error (context.DeadlineExceeded when the deadline would pass
// before the turn, which Wait knows at once).
type WaitError struct {
	// Node is the node's name.
	Node string
	// Kind is the call's kind.
	Kind Kind
	// Limit is the replica's share of the node's rate when the call gave up.
	Limit rate.Limit
	// Err is the context's error.
	Err error
}

func (e *WaitError) Error() string {
	return fmt.Sprintf("nodelimit: %s call to node %q: no turn at %s calls/s before the request ended: %v",
		e.Kind, e.Node, formatLimit(e.Limit), e.Err)
}

// Is reports whether target is ErrNoTurn.
func (e *WaitError) Is(target error) bool { return target == ErrNoTurn }

// Unwrap returns the context's error.
func (e *WaitError) Unwrap() error { return e.Err }

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
	case r < 1 || r > MaxRate || r != rate.Limit(math.Trunc(float64(r))):
		return fmt.Errorf("nodelimit: %s %v: must be a whole number of calls per second from 1 to %v, or rate.Inf", what, float64(r), float64(MaxRate))
	}
	return nil
}

// New returns a Limiter. It checks opts and starts nothing: Run reads the
// ready count in the background.
func New(opts Options) (*Limiter, error) {
	if opts.Rate == 0 {
		opts.Rate = DefaultRate
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
		opts.Refresh = DefaultRefresh
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	counter, err := opts.MeterProvider.Meter(MeterName).Int64Counter(MetricName,
		metric.WithDescription("Calls made to broker nodes (one Jolokia HTTP POST is one call), by kind."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("nodelimit: counter %s: %w", MetricName, err)
	}
	l := &Limiter{
		rate: opts.Rate, nodeRates: nodeRates, replicas: opts.Replicas, refresh: opts.Refresh,
		log: opts.Logger, counter: counter,
		addSearch: []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", string(KindSearch))))},
		addRead:   []metric.AddOption{metric.WithAttributeSet(attribute.NewSet(attribute.String("kind", string(KindRead))))},
		nodes:     map[string]*Node{},
	}
	l.ready.Store(1)
	return l, nil
}

// ErrRunTwice is returned by Run when it was called before on the same
// Limiter.
var ErrRunTwice = errors.New("nodelimit: Run called twice")

// Run reads the ready count at once and then every Refresh, adjusting every
// node's share, until ctx ends; it then returns nil, and the Limiter goes
// on limiting with the last share it had. A failed read is logged (once
// until a read succeeds again) and keeps the share in use. Without
// Options.Replicas it waits for ctx. Run may be called once; a second call
// returns ErrRunTwice at once.
func (l *Limiter) Run(ctx context.Context) error {
	if l.ran.Swap(true) {
		return ErrRunTwice
	}
	if l.replicas == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(l.refresh)
	defer t.Stop()
	for {
		_ = l.Refresh(ctx) // logged; the share in use stays
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Refresh reads the ready count now and adjusts every node's share when it
// changed. Run calls it every Refresh; a service may call it once its
// replica is registered, before Run. On an error the share in use stays.
// The read is bounded by ctx and by Refresh (at most 5s).
func (l *Limiter) Refresh(ctx context.Context) error {
	if l.replicas == nil {
		return nil
	}
	l.refreshMu.Lock()
	defer l.refreshMu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, min(l.refresh, 5*time.Second))
	defer cancel()
	n, err := l.replicas.ReadyReplicas(ctx)
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
		node.setShare(Share(node.total, n))
	}
}

// ReadyReplicas is the ready count the shares are computed with.
func (l *Limiter) ReadyReplicas() int { return int(l.ready.Load()) }

// Share is one replica's part of a node's rate total when ready replicas
// are ready: total / ready rounded up, at least 1; rate.Inf stays rate.Inf.
func Share(total rate.Limit, ready int) rate.Limit {
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
	share := Share(total, int(l.ready.Load()))
	n := &Node{name: name, total: total, l: l, rl: rate.NewLimiter(share, burst(share))}
	l.nodes[name] = n
	return n, nil
}

// Node limits this replica's calls to one broker node. It is safe for
// concurrent use.
type Node struct {
	name  string
	total rate.Limit
	l     *Limiter
	rl    *rate.Limiter
}

func (n *Node) setShare(share rate.Limit) {
	n.rl.SetLimit(share)
	n.rl.SetBurst(burst(share))
}

// Name is the node's name.
func (n *Node) Name() string { return n.name }

// Rate is the node's rate for the whole installation.
func (n *Node) Rate() rate.Limit { return n.total }

// Limit is this replica's share of the node's rate now, in calls per
// second.
func (n *Node) Limit() rate.Limit { return n.rl.Limit() }

// Burst is how many calls this replica may make at once after a quiet
// second: one second of its share.
func (n *Node) Burst() int { return n.rl.Burst() }

// Wait waits for this replica's turn to make one call of kind to the node,
// then counts the call in studio.broker.calls. When ctx ends first — or its
// deadline would pass before the turn, which Wait knows at once — it
// returns a *WaitError matching ErrNoTurn and the call is not counted.
// Wait makes no database round trip.
func (n *Node) Wait(ctx context.Context, kind Kind) error {
	var add []metric.AddOption
	switch kind {
	case KindSearch:
		add = n.l.addSearch
	case KindRead:
		add = n.l.addRead
	default:
		return fmt.Errorf("nodelimit: unknown call kind %q", kind)
	}
	if err := n.rl.Wait(ctx); err != nil {
		cause := ctx.Err()
		if cause == nil { // the deadline would pass before the turn
			cause = context.DeadlineExceeded
		}
		return &WaitError{Node: n.name, Kind: kind, Limit: n.rl.Limit(), Err: cause}
	}
	n.l.counter.Add(ctx, 1, add...)
	return nil
}

// ErrBatchLength is returned by ReadAll when a batch's read returns a
// different number of results than it was given items.
var ErrBatchLength = errors.New("nodelimit: a batch read returned the wrong number of results")

// ReadAll reads items in batches of at most size (BatchSize when size is
// zero or less), calling read once per batch, in order, and returns the
// results in the order of items. read makes one call (and so waits on the
// node's limiter once); it must return one result per item of its batch.
// ReadAll stops at the first error, returned wrapped with the batch it
// came from, and before each batch when ctx has ended.
func ReadAll[T, R any](ctx context.Context, items []T, size int, read func(ctx context.Context, batch []T) ([]R, error)) ([]R, error) {
	if size <= 0 {
		size = BatchSize
	}
	out := make([]R, 0, len(items))
	batches := (len(items) + size - 1) / size
	for i := 0; i < len(items); i += size {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		end := min(i+size, len(items))
		batch := items[i:end:end] // an append in read cannot reach the next batch
		got, err := read(ctx, batch)
		if err != nil {
			return nil, fmt.Errorf("batch %d of %d: %w", i/size+1, batches, err)
		}
		if len(got) != len(batch) {
			return nil, fmt.Errorf("%w: batch %d of %d: %d results for %d items", ErrBatchLength, i/size+1, batches, len(got), len(batch))
		}
		out = append(out, got...)
	}
	return out, nil
}
