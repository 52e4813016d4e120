// Package fakenode is a stand-in ActiveMQ Artemis broker node speaking the
// Jolokia subset of package jolokia, for tests, demos and load checks. It
// counts every call (one HTTP POST) it receives, by kind and by second,
// each stamped with the time it arrived (the kernel's, when served on a
// listener of Listen).
//
// Routes:
//
//	POST /jolokia/  a request object or a bulk array of them: search (with *
//	                wildcards in key property values) and read of
//	                MessageCount / ConsumerCount of its queues
//	GET  /stats     Stats as JSON
//
// Queue i (1..N) is named q<i> on address q<i>, anycast, with
// MessageCount(i) messages and ConsumerCount(i) consumers. Start one in a
// test with httptest.NewServer(fakenode.New(...)), or, to stamp each call
// with the kernel's receive time, serve it on Listen with ConnContext;
// cmd/fakenode serves one.
package fakenode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/jolokia"
)

// Options configure a Node.
type Options struct {
	// Queues is the number of queues, q1..qN. Default 0 (none).
	Queues int
	// Broker is the broker's name in MBean names. Default "fake".
	Broker string
	// Delay is added before every answer, to stand in for a slow node.
	// Default 0.
	Delay time.Duration
	// Now is the clock calls are timed with when the kernel does not stamp
	// them (see Listen), and Call.Handled's. Default time.Now.
	Now func() time.Time
	// KeepCalls is how many of the latest calls Calls returns. Default
	// 100,000.
	KeepCalls int
}

// Domain is the JMX domain of the queue MBeans.
const Domain = "org.apache.activemq.artemis"

// MessageCount is the MessageCount of queue i.
func MessageCount(i int) int64 { return int64(i) * 3 }

// ConsumerCount is the ConsumerCount of queue i.
func ConsumerCount(i int) int64 { return int64(i % 4) }

// MBean is the MBean name of queue i on broker.
func MBean(broker string, i int) string {
	q := jolokia.Quote("q" + strconv.Itoa(i))
	return fmt.Sprintf(`%s:broker=%s,component=addresses,address=%s,subcomponent=queues,routing-type="anycast",queue=%s`,
		Domain, jolokia.Quote(broker), q, q)
}

// Call is one call (HTTP POST) the node received.
type Call struct {
	// At is when the node received it: when the kernel received the
	// call's first byte (Stamped) on a connection of Listen, else when
	// the handler began (Handled).
	At time.Time `json:"at"`
	// Stamped is true when At is the kernel's stamp.
	Stamped bool `json:"stamped,omitempty"`
	// Handled is when the node's handler began, by Options.Now: later
	// than At by however long the node took to get to the call.
	Handled time.Time `json:"handled"`
	// Kind is search or read when every request of the call is of that
	// type, mixed when they differ, invalid when the body was not a
	// request.
	Kind string `json:"kind"`
	// Requests is the number of requests in the call.
	Requests int `json:"requests"`
}

// Second is the number of calls received in one second.
type Second struct {
	// Unix is the second, in Unix time.
	Unix int64 `json:"unix"`
	// Calls is the number of calls received in it.
	Calls int `json:"calls"`
}

// Stats are what the node received.
type Stats struct {
	// Queues is the node's number of queues.
	Queues int `json:"queues"`
	// Calls is the number of calls (HTTP POSTs) received.
	Calls int64 `json:"calls"`
	// ByKind counts calls by Call.Kind.
	ByKind map[string]int64 `json:"byKind"`
	// Requests counts the requests of all calls by type.
	Requests map[string]int64 `json:"requests"`
	// MaxRequestsPerCall is the largest number of requests in one call.
	MaxRequestsPerCall int `json:"maxRequestsPerCall"`
	// PerSecond has the calls of each of the last 60 seconds that had any,
	// oldest first.
	PerSecond []Second `json:"perSecond"`
	// MaxPerSecond is the most calls received in any one second so far.
	MaxPerSecond int `json:"maxPerSecond"`
}

// Node is a fake broker node; it is an http.Handler, safe for concurrent
// use.
type Node struct {
	broker  string
	queues  int
	delay   time.Duration
	now     func() time.Time
	keep    int
	byMBean map[string]int
	names   []string             // MBean names of q1..qN
	parsed  []jolokia.ObjectName // the same, parsed

	mu       sync.Mutex
	calls    []Call
	total    int64
	byKind   map[string]int64
	requests map[string]int64
	maxReq   int
	seconds  map[int64]int
	maxSec   int
}

// New returns a fake node. It fails on a negative number of queues.
func New(opts Options) (*Node, error) {
	if opts.Queues < 0 || opts.Queues > 10_000_000 {
		return nil, fmt.Errorf("fakenode: %d queues: must be from 0 to 10,000,000", opts.Queues)
	}
	if opts.Broker == "" {
		opts.Broker = "fake"
	}
	if opts.Delay < 0 {
		return nil, errors.New("fakenode: negative delay")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.KeepCalls <= 0 {
		opts.KeepCalls = 100_000
	}
	n := &Node{broker: opts.Broker, queues: opts.Queues, delay: opts.Delay, now: opts.Now, keep: opts.KeepCalls,
		byMBean: make(map[string]int, opts.Queues)}
	for i := 1; i <= opts.Queues; i++ {
		name := MBean(opts.Broker, i)
		on, err := jolokia.ParseObjectName(name)
		if err != nil {
			return nil, fmt.Errorf("fakenode: broker name %q: %w", opts.Broker, err)
		}
		n.byMBean[name] = i
		n.names = append(n.names, name)
		n.parsed = append(n.parsed, on)
	}
	n.Reset()
	return n, nil
}

// Reset forgets every call received.
func (n *Node) Reset() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.calls = nil
	n.total = 0
	n.byKind = map[string]int64{}
	n.requests = map[string]int64{}
	n.maxReq = 0
	n.seconds = map[int64]int{}
	n.maxSec = 0
}

// ServeHTTP serves POST /jolokia/ and GET /stats.
func (n *Node) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch {
	case r.URL.Path == "/stats" && r.Method == http.MethodGet:
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(n.Stats())
	case r.URL.Path == "/jolokia/" || r.URL.Path == "/jolokia":
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a Jolokia request", http.StatusMethodNotAllowed)
			return
		}
		n.serveJolokia(w, r)
	default:
		http.NotFound(w, r)
	}
}

type request struct {
	Type      string          `json:"type"`
	MBean     string          `json:"mbean"`
	Attribute json.RawMessage `json:"attribute"`
}

type response struct {
	Status    int    `json:"status"`
	Value     any    `json:"value,omitempty"`
	Error     string `json:"error,omitempty"`
	ErrorType string `json:"error_type,omitempty"`
	Request   any    `json:"request,omitempty"`
}

func (n *Node) serveJolokia(w http.ResponseWriter, r *http.Request) {
	handled := n.now()
	at := callAt{handled: handled, at: handled}
	if k, stamped, ok := received(r.Context()); ok {
		at.at, at.stamped = k, stamped
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<20))
	var reqs []request
	single := false
	if err == nil {
		trimmed := bytes.TrimSpace(body)
		if len(trimmed) > 0 && trimmed[0] == '{' {
			single = true
			var one request
			err = json.Unmarshal(trimmed, &one)
			reqs = []request{one}
		} else {
			err = json.Unmarshal(trimmed, &reqs)
		}
	}
	if err != nil {
		n.record(at, nil)
		n.pause()
		writeJSON(w, response{Status: 400, ErrorType: "java.lang.IllegalArgumentException", Error: "Invalid JSON request: " + err.Error()})
		return
	}
	n.record(at, reqs)
	out := make([]response, len(reqs))
	for i, q := range reqs {
		out[i] = n.answer(q)
	}
	n.pause()
	if single {
		writeJSON(w, out[0])
		return
	}
	writeJSON(w, out)
}

func (n *Node) pause() {
	if n.delay > 0 {
		time.Sleep(n.delay)
	}
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// callAt is when a call was received and handled.
type callAt struct {
	at, handled time.Time
	stamped     bool
}

func (n *Node) record(t callAt, reqs []request) {
	at := t.at
	kind := "invalid"
	for i, q := range reqs {
		switch {
		case i == 0:
			kind = q.Type
		case q.Type != kind:
			kind = "mixed"
		}
	}
	if kind != "search" && kind != "read" && kind != "mixed" {
		kind = "invalid"
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	n.total++
	n.byKind[kind]++
	for _, q := range reqs {
		n.requests[q.Type]++
	}
	n.maxReq = max(n.maxReq, len(reqs))
	sec := at.Unix()
	n.seconds[sec]++
	n.maxSec = max(n.maxSec, n.seconds[sec])
	for s := range n.seconds {
		if s < sec-60 {
			delete(n.seconds, s)
		}
	}
	if len(n.calls) >= n.keep {
		n.calls = slices.Delete(n.calls, 0, len(n.calls)-n.keep+1)
	}
	n.calls = append(n.calls, Call{At: at, Stamped: t.stamped, Handled: t.handled, Kind: kind, Requests: len(reqs)})
}

func (n *Node) answer(q request) response {
	switch q.Type {
	case "search":
		pat, err := jolokia.ParseObjectName(q.MBean)
		if err != nil {
			return response{Status: 400, ErrorType: "javax.management.MalformedObjectNameException", Error: err.Error()}
		}
		names := []string{}
		if pat.Domain == Domain {
			for i, on := range n.parsed {
				if matches(pat, on) {
					names = append(names, n.names[i])
				}
			}
		}
		return response{Status: 200, Value: names}
	case "read":
		i, ok := n.byMBean[q.MBean]
		if !ok {
			return response{Status: 404, ErrorType: "javax.management.InstanceNotFoundException", Error: q.MBean}
		}
		attrs, err := attributes(q.Attribute)
		if err != nil {
			return response{Status: 400, ErrorType: "java.lang.IllegalArgumentException", Error: err.Error()}
		}
		v := map[string]int64{}
		for _, a := range attrs {
			switch a {
			case jolokia.AttrMessageCount:
				v[a] = MessageCount(i)
			case jolokia.AttrConsumerCount:
				v[a] = ConsumerCount(i)
			default:
				return response{Status: 404, ErrorType: "javax.management.AttributeNotFoundException", Error: "No such attribute: " + a}
			}
		}
		return response{Status: 200, Value: v}
	default:
		return response{Status: 400, ErrorType: "java.lang.IllegalArgumentException", Error: fmt.Sprintf("Unsupported type %q", q.Type)}
	}
}

// attributes reads a read request's attribute: a name or a list of names;
// none means both counters.
func attributes(raw json.RawMessage) ([]string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return []string{jolokia.AttrMessageCount, jolokia.AttrConsumerCount}, nil
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []string{one}, nil
	}
	var many []string
	if err := json.Unmarshal(raw, &many); err != nil {
		return nil, errors.New("attribute must be a name or a list of names")
	}
	return many, nil
}

// matches reports whether on matches the pattern pat: the same key
// properties, each value equal or matched by * and ? wildcards.
func matches(pat, on jolokia.ObjectName) bool {
	if pat.Domain != on.Domain || len(pat.Keys) != len(on.Keys) {
		return false
	}
	for k, pv := range pat.Keys {
		v, ok := on.Keys[k]
		if !ok || !wildcard(pv, v) {
			return false
		}
	}
	return true
}

func wildcard(pattern, s string) bool {
	if pattern == "" {
		return s == ""
	}
	switch pattern[0] {
	case '*':
		for i := 0; i <= len(s); i++ {
			if wildcard(pattern[1:], s[i:]) {
				return true
			}
		}
		return false
	case '?':
		return s != "" && wildcard(pattern[1:], s[1:])
	}
	return s != "" && s[0] == pattern[0] && wildcard(pattern[1:], s[1:])
}

// Stats returns what the node received so far.
func (n *Node) Stats() Stats {
	n.mu.Lock()
	defer n.mu.Unlock()
	st := Stats{Queues: n.queues, Calls: n.total, ByKind: map[string]int64{}, Requests: map[string]int64{},
		MaxRequestsPerCall: n.maxReq, MaxPerSecond: n.maxSec, PerSecond: []Second{}}
	for k, v := range n.byKind {
		st.ByKind[k] = v
	}
	for k, v := range n.requests {
		st.Requests[k] = v
	}
	for s, c := range n.seconds {
		st.PerSecond = append(st.PerSecond, Second{Unix: s, Calls: c})
	}
	slices.SortFunc(st.PerSecond, func(a, b Second) int { return int(a.Unix - b.Unix) })
	return st
}

// Calls returns the latest calls received (at most Options.KeepCalls),
// oldest first.
func (n *Node) Calls() []Call {
	n.mu.Lock()
	defer n.mu.Unlock()
	return slices.Clone(n.calls)
}

// String describes the node.
func (n *Node) String() string {
	return fmt.Sprintf("fake broker node %q with %d queues", n.broker, n.queues)
}

// Summary is a one-line report of stats for a log.
func (st Stats) Summary() string {
	var b strings.Builder
	fmt.Fprintf(&b, "calls=%d search=%d read=%d max/s=%d", st.Calls, st.ByKind["search"], st.ByKind["read"], st.MaxPerSecond)
	if k := len(st.PerSecond); k > 0 {
		fmt.Fprintf(&b, " last=%d/s", st.PerSecond[k-1].Calls)
	}
	return b.String()
}
