// Package jolokia is a small client of the Jolokia subset a service speaks
// to an ActiveMQ Artemis broker node: a bulk POST of search and read
// requests to {URL}/jolokia/.
//
// Every POST is one call for the node limiter: before it is sent the client
// waits for its turn on a Gate (a *nodelimit.Node), then counts it in the
// reference service's counter studio.broker.calls, tagged kind (search or
// read): the kinds are this client's vocabulary, not the limiter's, which
// only shares a call rate. Queues lists a node's queues with their
// MessageCount and ConsumerCount: one search call, then the reads in
// batches of at most ReadsPerCall (200) per call (ReadAll).
//
// A node that does not answer in time, cannot be reached, or answers
// something that is not the expected Jolokia answer gives an *Error
// matching ErrNode (and ErrNoAnswer or ErrBadAnswer), which a service maps
// to 502; WriteError does so. A call that got no turn before the request
// ended gives nodelimit.ErrNoTurn.
package jolokia

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// MetricCalls is the counter of calls made to broker nodes, tagged kind
// (search, read): one POST is one call.
const MetricCalls = "studio.broker.calls"

// Kind is the kind of a call to a broker node, the value of the kind
// attribute of studio.broker.calls.
type Kind string

const (
	// KindSearch is a search for MBean names.
	KindSearch Kind = "search"
	// KindRead is a read of MBean attributes.
	KindRead Kind = "read"
)

// ReadsPerCall is the most reads one POST carries, and ReadAll's batch
// size when its size is zero or less.
const ReadsPerCall = 200

// QueuePattern is the search pattern of every queue MBean of a node.
const QueuePattern = "org.apache.activemq.artemis:broker=*,component=addresses,address=*,subcomponent=queues,routing-type=*,queue=*"

// Attributes read from each queue MBean.
const (
	AttrMessageCount  = "MessageCount"
	AttrConsumerCount = "ConsumerCount"
)

// DefaultTimeout bounds one POST when Options.Timeout is zero.
const DefaultTimeout = 10 * time.Second

// DefaultMaxAnswerBytes bounds the body of one answer when
// Options.MaxAnswerBytes is zero.
const DefaultMaxAnswerBytes = 32 << 20

// Gate is what a POST waits on for its turn; *nodelimit.Node implements it.
// It is told nothing of the call: every kind waits on the same turn.
type Gate interface {
	Wait(ctx context.Context) error
}

// Options configure a Client.
type Options struct {
	// Timeout bounds one POST, from sending it to reading the whole answer
	// (not the wait for its turn, which the caller's context bounds).
	// Default 10s.
	Timeout time.Duration
	// HTTPClient sends the POSTs. Default: a client of its own that follows
	// no redirects.
	HTTPClient *http.Client
	// MaxAnswerBytes bounds the body of one answer; a longer one is a bad
	// answer. Default 32 MiB.
	MaxAnswerBytes int64
	// User and Password, when User is set, are sent as HTTP basic
	// authentication. Default none.
	User, Password string
	// MeterProvider provides the counter studio.broker.calls. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Client calls one broker node's Jolokia agent. It is safe for concurrent
// use.
type Client struct {
	endpoint  string
	gate      Gate
	http      *http.Client
	timeout   time.Duration
	maxAnswer int64
	user, pw  string
	calls     metric.Int64Counter
}

// New returns a client of the node whose Jolokia base URL is baseURL (e.g.
// http://broker-1:8161; a URL already ending in /jolokia is accepted too).
// Every POST waits on gate first.
func New(baseURL string, gate Gate, opts Options) (*Client, error) {
	endpoint, err := endpointOf(baseURL)
	if err != nil {
		return nil, err
	}
	if gate == nil {
		return nil, errors.New("jolokia: nil gate (every call must go through the node limiter)")
	}
	if opts.Timeout < 0 || opts.MaxAnswerBytes < 0 {
		return nil, errors.New("jolokia: negative timeout or answer bound")
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.MaxAnswerBytes == 0 {
		opts.MaxAnswerBytes = DefaultMaxAnswerBytes
	}
	if opts.HTTPClient == nil {
		opts.HTTPClient = &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	calls, err := opts.MeterProvider.Meter("github.com/pglimit/pglimit/cmd/studio/jolokia").Int64Counter(MetricCalls,
		metric.WithDescription("Calls made to broker nodes (one Jolokia HTTP POST is one call), by kind."),
		metric.WithUnit("{call}"))
	if err != nil {
		return nil, fmt.Errorf("jolokia: counter %s: %w", MetricCalls, err)
	}
	return &Client{endpoint: endpoint, gate: gate, http: opts.HTTPClient, timeout: opts.Timeout,
		maxAnswer: opts.MaxAnswerBytes, user: opts.User, pw: opts.Password, calls: calls}, nil
}

func endpointOf(baseURL string) (string, error) {
	bad := func(why string) (string, error) {
		return "", fmt.Errorf("jolokia: node URL %q: %s", baseURL, why)
	}
	if strings.TrimSpace(baseURL) != baseURL || baseURL == "" {
		return bad("empty or blank at either end")
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return bad("not a URL")
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return bad("the scheme must be http or https")
	}
	if u.Hostname() == "" {
		return bad("no host")
	}
	if p := u.Port(); p != "" {
		if n, err := strconv.Atoi(p); err != nil || n < 1 || n > 65535 {
			return bad("bad port")
		}
	}
	if u.User != nil {
		return bad("credentials belong in Options.User and Options.Password, not the URL")
	}
	if u.RawQuery != "" || u.ForceQuery || u.Fragment != "" {
		return bad("a query or fragment")
	}
	path := strings.TrimRight(u.Path, "/")
	path = strings.TrimSuffix(path, "/jolokia")
	u.Path = path + "/jolokia/"
	u.RawPath = ""
	return u.String(), nil
}

// Endpoint is the URL the client POSTs to.
func (c *Client) Endpoint() string { return c.endpoint }

// ErrNode is matched by every *Error: the node could not be reached or
// answered something unusable. A service answers 502.
var ErrNode = errors.New("jolokia: broker node unreachable or answered garbage")

// ErrNoAnswer is matched by an *Error whose node did not answer: refused,
// reset, or not within the timeout.
var ErrNoAnswer = errors.New("jolokia: broker node did not answer")

// ErrBadAnswer is matched by an *Error whose node answered, but not with
// the Jolokia answer asked for: an HTTP error status, a body that is not
// JSON, the wrong number of results, an error status for a request, or a
// value of the wrong shape.
var ErrBadAnswer = errors.New("jolokia: broker node answered garbage")

// Error is a failed call to a node. Its text is for logs, not for clients.
type Error struct {
	// Endpoint is the URL posted to.
	Endpoint string
	// Kind is the call's kind.
	Kind Kind
	// NoAnswer is true when the node did not answer, false when it answered
	// garbage.
	NoAnswer bool
	// Reason says what went wrong.
	Reason string
	// Err is the underlying error, if any.
	Err error
}

func (e *Error) Error() string {
	s := fmt.Sprintf("jolokia: %s call to %s: %s", e.Kind, e.Endpoint, e.Reason)
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

// Is matches ErrNode, and ErrNoAnswer or ErrBadAnswer.
func (e *Error) Is(target error) bool {
	return target == ErrNode || (target == ErrNoAnswer && e.NoAnswer) || (target == ErrBadAnswer && !e.NoAnswer)
}

// Unwrap returns the underlying error.
func (e *Error) Unwrap() error { return e.Err }

// Request is one Jolokia request of a bulk POST.
type Request struct {
	Type      string   `json:"type"`
	MBean     string   `json:"mbean"`
	Attribute []string `json:"attribute,omitempty"`
}

// Response is one Jolokia answer of a bulk POST.
type Response struct {
	// Status is the request's status, 200 when it succeeded.
	Status int `json:"status"`
	// Value is the answer's value.
	Value json.RawMessage `json:"value"`
	// Error and ErrorType describe a failed request.
	Error     string `json:"error,omitempty"`
	ErrorType string `json:"error_type,omitempty"`
}

var errTimeout = errors.New("no answer within the timeout")

// Bulk sends reqs in one POST, as a call of kind, after waiting for the
// call's turn, and returns the node's answers in the same order. Only
// transport and shape are checked here: one answer per request, each with a
// status; a request's own error status is left to the caller.
func (c *Client) Bulk(ctx context.Context, kind Kind, reqs []Request) ([]Response, error) {
	if len(reqs) == 0 {
		return nil, nil
	}
	body, err := json.Marshal(reqs)
	if err != nil {
		return nil, fmt.Errorf("jolokia: encode requests: %w", err)
	}
	if err := c.gate.Wait(ctx); err != nil {
		return nil, err
	}
	c.calls.Add(ctx, 1, metric.WithAttributes(attribute.String("kind", string(kind))))
	fail := func(noAnswer bool, reason string, err error) error {
		return &Error{Endpoint: c.endpoint, Kind: kind, NoAnswer: noAnswer, Reason: reason, Err: err}
	}
	pctx, cancel := context.WithTimeoutCause(ctx, c.timeout, errTimeout)
	defer cancel()
	// transportErr tells the node's silence from the caller's context
	// ending, which is not the node's fault and is returned as it is.
	transportErr := func(what string, err error) error {
		if ctx.Err() != nil {
			return fmt.Errorf("jolokia: %s call: %w", kind, ctx.Err())
		}
		if errors.Is(context.Cause(pctx), errTimeout) {
			return fail(true, fmt.Sprintf("no answer within %v", c.timeout), nil)
		}
		return fail(true, what, err)
	}
	req, err := http.NewRequestWithContext(pctx, http.MethodPost, c.endpoint, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("jolokia: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "application/json")
	if c.user != "" {
		req.SetBasicAuth(c.user, c.pw)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, transportErr("no answer", err)
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, c.maxAnswer+1))
	if err != nil {
		return nil, transportErr("answer cut short", err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fail(false, fmt.Sprintf("HTTP status %d", resp.StatusCode), nil)
	}
	if int64(len(data)) > c.maxAnswer {
		return nil, fail(false, fmt.Sprintf("answer longer than %d bytes", c.maxAnswer), nil)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		var one Response
		if json.Unmarshal(data, &one) == nil && one.Status != 0 {
			return nil, fail(false, fmt.Sprintf("the bulk request failed with status %d: %s", one.Status, one.Error), nil)
		}
		return nil, fail(false, "the answer is not a JSON array", err)
	}
	if len(raw) != len(reqs) {
		return nil, fail(false, fmt.Sprintf("%d answers to %d requests", len(raw), len(reqs)), nil)
	}
	out := make([]Response, len(raw))
	for i, r := range raw {
		if err := json.Unmarshal(r, &out[i]); err != nil {
			return nil, fail(false, fmt.Sprintf("answer %d is not a Jolokia response", i), err)
		}
		if out[i].Status == 0 {
			return nil, fail(false, fmt.Sprintf("answer %d has no status", i), nil)
		}
	}
	return out, nil
}

// Search returns the MBean names matching pattern, in one search call.
func (c *Client) Search(ctx context.Context, pattern string) ([]string, error) {
	resps, err := c.Bulk(ctx, KindSearch, []Request{{Type: "search", MBean: pattern}})
	if err != nil {
		return nil, err
	}
	r := resps[0]
	if r.Status != http.StatusOK {
		return nil, &Error{Endpoint: c.endpoint, Kind: KindSearch,
			Reason: fmt.Sprintf("search failed with status %d: %s", r.Status, r.Error)}
	}
	var names []string
	if err := json.Unmarshal(r.Value, &names); err != nil || names == nil && !bytes.Equal(bytes.TrimSpace(r.Value), []byte("[]")) {
		return nil, &Error{Endpoint: c.endpoint, Kind: KindSearch, Reason: "search value is not a list of names", Err: err}
	}
	return names, nil
}

// Counts are a queue MBean's counters.
type Counts struct {
	// Found is false when the MBean is gone (status 404: the queue was
	// deleted since it was found); the counts are then zero.
	Found bool
	// MessageCount is the number of messages in the queue.
	MessageCount int64
	// ConsumerCount is the number of consumers of the queue.
	ConsumerCount int64
}

// ReadCounts reads MessageCount and ConsumerCount of each MBean, in calls
// of at most ReadsPerCall reads, and returns them in the order of mbeans.
func (c *Client) ReadCounts(ctx context.Context, mbeans []string) ([]Counts, error) {
	return ReadAll(ctx, mbeans, ReadsPerCall, c.readBatch)
}

// errBatchLength is returned by ReadAll when a batch's read returns a
// different number of results than it was given items.
var errBatchLength = errors.New("jolokia: a batch read returned the wrong number of results")

// ReadAll reads items in batches of at most size (ReadsPerCall, 200, when
// size is zero or less), calling read once per batch, in order, and
// returns the results in the order of items. read makes one call (and so
// waits on the node's Gate once); it must return one result per item of
// its batch, or ReadAll fails. ReadAll stops at the first error, returned
// wrapped with the batch it came from, and before each batch when ctx has
// ended.
func ReadAll[T, R any](ctx context.Context, items []T, size int, read func(ctx context.Context, batch []T) ([]R, error)) ([]R, error) {
	if size <= 0 {
		size = ReadsPerCall
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
			return nil, fmt.Errorf("%w: batch %d of %d: %d results for %d items", errBatchLength, i/size+1, batches, len(got), len(batch))
		}
		out = append(out, got...)
	}
	return out, nil
}

func (c *Client) readBatch(ctx context.Context, mbeans []string) ([]Counts, error) {
	reqs := make([]Request, len(mbeans))
	for i, m := range mbeans {
		reqs[i] = Request{Type: "read", MBean: m, Attribute: []string{AttrMessageCount, AttrConsumerCount}}
	}
	resps, err := c.Bulk(ctx, KindRead, reqs)
	if err != nil {
		return nil, err
	}
	out := make([]Counts, len(resps))
	for i, r := range resps {
		bad := func(reason string, err error) error {
			return &Error{Endpoint: c.endpoint, Kind: KindRead, Reason: fmt.Sprintf("read of %s: %s", mbeans[i], reason), Err: err}
		}
		switch r.Status {
		case http.StatusOK:
		case http.StatusNotFound:
			continue // gone since the search
		default:
			return nil, bad(fmt.Sprintf("status %d: %s", r.Status, r.Error), nil)
		}
		var v map[string]json.Number
		dec := json.NewDecoder(bytes.NewReader(r.Value))
		dec.UseNumber()
		if err := dec.Decode(&v); err != nil {
			return nil, bad("value is not an object of numbers", err)
		}
		mc, err1 := counter(v, AttrMessageCount)
		cc, err2 := counter(v, AttrConsumerCount)
		if err := errors.Join(err1, err2); err != nil {
			return nil, bad("bad attributes", err)
		}
		out[i] = Counts{Found: true, MessageCount: mc, ConsumerCount: cc}
	}
	return out, nil
}

func counter(v map[string]json.Number, attr string) (int64, error) {
	n, ok := v[attr]
	if !ok {
		return 0, fmt.Errorf("no %s", attr)
	}
	i, err := n.Int64()
	if err != nil || i < 0 {
		return 0, fmt.Errorf("%s %q is not a count", attr, n)
	}
	return i, nil
}

// Queue is one queue of a node.
type Queue struct {
	// Name is the queue's name.
	Name string `json:"name"`
	// Address is the address the queue is bound to.
	Address string `json:"address"`
	// RoutingType is anycast or multicast.
	RoutingType string `json:"routingType"`
	// MBean is the queue's MBean name.
	MBean string `json:"mbean"`
	// MessageCount is the number of messages in the queue.
	MessageCount int64 `json:"messageCount"`
	// ConsumerCount is the number of consumers of the queue.
	ConsumerCount int64 `json:"consumerCount"`
}

// Queues lists the node's queues with their MessageCount and
// ConsumerCount, sorted by name, address and routing type: one search call,
// then one read call per ReadsPerCall queues. A queue deleted
// between the search and its read is left out.
func (c *Client) Queues(ctx context.Context) ([]Queue, error) {
	names, err := c.Search(ctx, QueuePattern)
	if err != nil {
		return nil, err
	}
	queues := make([]Queue, len(names))
	for i, name := range names {
		on, err := ParseObjectName(name)
		if err != nil {
			return nil, &Error{Endpoint: c.endpoint, Kind: KindSearch, Reason: "search answered a name that is not an MBean name", Err: err}
		}
		queues[i] = Queue{Name: on.Keys["queue"], Address: on.Keys["address"], RoutingType: on.Keys["routing-type"], MBean: name}
		if queues[i].Name == "" {
			return nil, &Error{Endpoint: c.endpoint, Kind: KindSearch, Reason: fmt.Sprintf("search answered %s, not a queue MBean", name)}
		}
	}
	counts, err := c.ReadCounts(ctx, names)
	if err != nil {
		return nil, err
	}
	out := queues[:0]
	for i, q := range queues {
		if !counts[i].Found {
			continue
		}
		q.MessageCount, q.ConsumerCount = counts[i].MessageCount, counts[i].ConsumerCount
		out = append(out, q)
	}
	slices.SortFunc(out, func(a, b Queue) int {
		return cmpStrings(a.Name, b.Name, a.Address, b.Address, a.RoutingType, b.RoutingType)
	})
	return out, nil
}

func cmpStrings(pairs ...string) int {
	for i := 0; i+1 < len(pairs); i += 2 {
		if c := strings.Compare(pairs[i], pairs[i+1]); c != 0 {
			return c
		}
	}
	return 0
}
