package jolokia_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
	"github.com/pglimit/pglimit/cmd/internal/jolokia"
	"github.com/pglimit/pglimit/nodelimit"
)

// countingGate is a gate that lets every call through (unless it refuses
// them all) and counts the waits; it is told nothing of the calls' kinds.
type countingGate struct {
	waits  atomic.Int64
	refuse error
}

func (g *countingGate) Wait(context.Context) error {
	if g.refuse != nil {
		return g.refuse
	}
	g.waits.Add(1)
	return nil
}

// noTurn is the error of a call that got no turn from a node limiter: a
// second call at 1 per second whose deadline comes before its turn.
func noTurn(t *testing.T) error {
	t.Helper()
	l, err := nodelimit.New(nodelimit.Options{Rate: 1})
	if err != nil {
		t.Fatal(err)
	}
	node, _ := l.Node("b1")
	if err := node.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err = node.Wait(ctx)
	if !errors.Is(err, nodelimit.ErrNoTurn) {
		t.Fatalf("second call at 1/s within 100 ms: %v, want ErrNoTurn", err)
	}
	return err
}

func fakeNode(t *testing.T, queues int) (*fakenode.Node, *httptest.Server) {
	t.Helper()
	fn, err := fakenode.New(fakenode.Options{Queues: queues})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(fn)
	t.Cleanup(srv.Close)
	return fn, srv
}

func client(t *testing.T, url string, gate jolokia.Gate, opts jolokia.Options) *jolokia.Client {
	t.Helper()
	c, err := jolokia.New(url, gate, opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestQueuesIn200Batches: 450 queues are listed with one search call and
// three read calls of at most 200 reads, each through the gate, and every
// queue gets its own counts.
func TestQueuesIn200Batches(t *testing.T) {
	t.Parallel()
	fn, srv := fakeNode(t, 450)
	gate := &countingGate{}
	qs, err := client(t, srv.URL, gate, jolokia.Options{}).Queues(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(qs) != 450 {
		t.Fatalf("%d queues, want 450", len(qs))
	}
	seen := map[string]bool{}
	for _, q := range qs {
		var i int
		if _, err := fmt.Sscanf(q.Name, "q%d", &i); err != nil {
			t.Fatalf("queue %+v", q)
		}
		want := jolokia.Queue{Name: q.Name, Address: q.Name, RoutingType: "anycast", MBean: fakenode.MBean("fake", i),
			MessageCount: fakenode.MessageCount(i), ConsumerCount: fakenode.ConsumerCount(i)}
		if diff := cmp.Diff(want, q); diff != "" {
			t.Fatalf("queue %s (-want +got):\n%s", q.Name, diff)
		}
		seen[q.Name] = true
	}
	if len(seen) != 450 {
		t.Fatalf("%d distinct queues", len(seen))
	}
	for i := 1; i < len(qs); i++ {
		if qs[i-1].Name >= qs[i].Name {
			t.Fatalf("not sorted by name at %d: %s, %s", i, qs[i-1].Name, qs[i].Name)
		}
	}

	var got []fakenode.Call
	for _, c := range fn.Calls() {
		got = append(got, fakenode.Call{Kind: c.Kind, Requests: c.Requests})
	}
	want := []fakenode.Call{{Kind: "search", Requests: 1}, {Kind: "read", Requests: 200}, {Kind: "read", Requests: 200}, {Kind: "read", Requests: 50}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("calls the node received (-want +got):\n%s", diff)
	}
	if st := fn.Stats(); st.MaxRequestsPerCall != 200 || st.Calls != 4 {
		t.Fatalf("stats %+v", st)
	}
	if n := gate.waits.Load(); n != 4 {
		t.Fatalf("the gate saw %d waits, want 4 (one per POST: 1 search and 3 reads)", n)
	}
}

// TestCallsCounted: every POST is counted in studio.broker.calls by kind,
// once it got its turn; a call refused its turn is not counted.
func TestCallsCounted(t *testing.T) {
	t.Parallel()
	_, srv := fakeNode(t, 450)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	if _, err := client(t, srv.URL, &countingGate{}, jolokia.Options{MeterProvider: mp}).Queues(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := client(t, srv.URL, &countingGate{refuse: noTurn(t)}, jolokia.Options{MeterProvider: mp}).Queues(context.Background()); err == nil {
		t.Fatal("a call without a turn succeeded")
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != jolokia.MetricCalls {
				continue
			}
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || !sum.IsMonotonic {
				t.Fatalf("%s is %T, want a monotonic int64 sum", m.Name, m.Data)
			}
			for _, dp := range sum.DataPoints {
				kind, _ := dp.Attributes.Value("kind")
				got[kind.AsString()] += dp.Value
			}
		}
	}
	if want := map[string]int64{"search": 1, "read": 3}; !cmp.Equal(got, want) {
		t.Fatalf("studio.broker.calls = %v, want %v", got, want)
	}
}

// TestQueuesThroughTheLimiter: with a real node limiter every POST waits
// for its turn: at 2 calls per second (burst 2) the four calls of 450
// queues cannot all be made within a second.
func TestQueuesThroughTheLimiter(t *testing.T) {
	t.Parallel()
	_, srv := fakeNode(t, 450)
	l, err := nodelimit.New(nodelimit.Options{Rate: 2})
	if err != nil {
		t.Fatal(err)
	}
	node, _ := l.Node("fake")
	ctx, cancel := context.WithTimeout(context.Background(), 900*time.Millisecond)
	defer cancel()
	_, err = client(t, srv.URL, node, jolokia.Options{}).Queues(ctx)
	if !errors.Is(err, nodelimit.ErrNoTurn) || errors.Is(err, jolokia.ErrNode) {
		t.Fatalf("4 calls at 2/s within 900 ms: %v, want ErrNoTurn", err)
	}
}

func TestEmptyNode(t *testing.T) {
	t.Parallel()
	fn, srv := fakeNode(t, 0)
	qs, err := client(t, srv.URL, &countingGate{}, jolokia.Options{}).Queues(context.Background())
	if err != nil || len(qs) != 0 {
		t.Fatalf("Queues = %v, %v; want none", qs, err)
	}
	if st := fn.Stats(); st.Calls != 1 {
		t.Fatalf("%d calls, want only the search", st.Calls)
	}
}

// TestQueueGoneBeforeItsRead: a queue deleted between the search and its
// read (404 for its read) is left out; the others are listed.
func TestQueueGoneBeforeItsRead(t *testing.T) {
	t.Parallel()
	gone := fakenode.MBean("fake", 999)
	kept := fakenode.MBean("fake", 2)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var reqs []jolokia.Request
		_ = json.NewDecoder(r.Body).Decode(&reqs)
		if reqs[0].Type == "search" {
			fmt.Fprintf(w, `[{"status":200,"value":[%q,%q]}]`, gone, kept)
			return
		}
		fmt.Fprint(w, `[{"status":404,"error":"gone"},{"status":200,"value":{"MessageCount":7,"ConsumerCount":1}}]`)
	}))
	defer srv.Close()
	qs, err := client(t, srv.URL, &countingGate{}, jolokia.Options{}).Queues(context.Background())
	want := []jolokia.Queue{{Name: "q2", Address: "q2", RoutingType: "anycast", MBean: kept, MessageCount: 7, ConsumerCount: 1}}
	if err != nil || !cmp.Equal(qs, want) {
		t.Fatalf("Queues = %+v, %v; want %+v", qs, err, want)
	}
}

func TestBadURLs(t *testing.T) {
	t.Parallel()
	gate := &countingGate{}
	for _, tc := range []struct{ url, want string }{
		{"", "empty"},
		{" http://h", "blank"},
		{"localhost:8161", "scheme"},
		{"ftp://h/", "scheme"},
		{"http://", "no host"},
		{"http:///jolokia", "no host"},
		{"http://h:99999", "bad port"},
		{"http://h:0", "bad port"},
		{"http://user:pw@h", "credentials"},
		{"http://h/?x=1", "query"},
		{"http://h/?", "query"},
		{"http://h/#top", "fragment"},
		{"://nope", "not a URL"},
		{"http://[::1", "not a URL"},
	} {
		t.Run(tc.url, func(t *testing.T) {
			c, err := jolokia.New(tc.url, gate, jolokia.Options{})
			if err == nil || !strings.Contains(err.Error(), tc.want) || c != nil {
				t.Fatalf("New(%q) = %v, %v; want an error containing %q", tc.url, c, err, tc.want)
			}
		})
	}
	for _, tc := range []struct {
		name string
		gate jolokia.Gate
		opts jolokia.Options
	}{
		{"nil gate", nil, jolokia.Options{}},
		{"negative timeout", gate, jolokia.Options{Timeout: -time.Second}},
		{"negative answer bound", gate, jolokia.Options{MaxAnswerBytes: -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c, err := jolokia.New("http://h", tc.gate, tc.opts); err == nil {
				t.Fatalf("New = %v, no error", c)
			}
		})
	}
	for in, want := range map[string]string{
		"http://h":                     "http://h/jolokia/",
		"http://h:8161/":               "http://h:8161/jolokia/",
		"https://h/console/jolokia":    "https://h/console/jolokia/",
		"http://h/jolokia/":            "http://h/jolokia/",
		"http://[::1]:8161/prefix//":   "http://[::1]:8161/prefix/jolokia/",
		"http://broker-1.example:8161": "http://broker-1.example:8161/jolokia/",
	} {
		c, err := jolokia.New(in, gate, jolokia.Options{})
		if err != nil || c.Endpoint() != want {
			t.Errorf("New(%q): endpoint %v, %v; want %q", in, c, err, want)
		}
	}
}

// TestGarbageAnswers: whatever a node answers that is not the Jolokia
// answer asked for is an *Error matching ErrNode and ErrBadAnswer.
func TestGarbageAnswers(t *testing.T) {
	t.Parallel()
	search := func(body string) func(string) (int, string) {
		return func(reqType string) (int, string) {
			if reqType == "search" {
				return 200, body
			}
			return 200, `[]`
		}
	}
	read := func(body string) func(string) (int, string) {
		return func(reqType string) (int, string) {
			if reqType == "search" {
				return 200, fmt.Sprintf(`[{"status":200,"value":[%q]}]`, fakenode.MBean("fake", 1))
			}
			return 200, body
		}
	}
	for _, tc := range []struct {
		name   string
		answer func(reqType string) (status int, body string)
		reason string
	}{
		{"HTTP 500", func(string) (int, string) { return 500, `oops` }, "HTTP status 500"},
		{"HTTP 401", func(string) (int, string) { return 401, `[]` }, "HTTP status 401"},
		{"redirect", func(string) (int, string) { return 302, `` }, "HTTP status 302"},
		{"HTML", search(`<html>login</html>`), "not a JSON array"},
		{"empty body", search(``), "not a JSON array"},
		{"truncated JSON", search(`[{"status":200,"value":[`), "not a JSON array"},
		{"whole request failed", search(`{"status":400,"error":"bad request"}`), "failed with status 400"},
		{"object without status", search(`{"value":1}`), "not a JSON array"},
		{"no answers", search(`[]`), "0 answers to 1 requests"},
		{"two answers to one", search(`[{"status":200,"value":[]},{"status":200,"value":[]}]`), "2 answers to 1"},
		{"answer not an object", search(`[42]`), "not a Jolokia response"},
		{"answer without status", search(`[{"value":[]}]`), "no status"},
		{"search refused", search(`[{"status":403,"error":"forbidden"}]`), "search failed with status 403"},
		{"search value not a list", search(`[{"status":200,"value":{"a":1}}]`), "not a list of names"},
		{"search value null", search(`[{"status":200,"value":null}]`), "not a list of names"},
		{"search value list of numbers", search(`[{"status":200,"value":[1,2]}]`), "not a list of names"},
		{"name not an MBean", search(`[{"status":200,"value":["not an mbean"]}]`), "not an MBean name"},
		{"name unterminated quote", search(`[{"status":200,"value":["d:queue=\"q1"]}]`), "not an MBean name"},
		{"MBean not a queue", search(`[{"status":200,"value":["d:type=Broker"]}]`), "not a queue MBean"},
		{"read answers too few", read(`[]`), "0 answers to 1 requests"},
		{"read answers too many", read(`[{"status":200,"value":{"MessageCount":1,"ConsumerCount":1}},{"status":200,"value":{}}]`), "2 answers to 1"},
		{"read error status", read(`[{"status":500,"error":"boom"}]`), "status 500"},
		{"read value not an object", read(`[{"status":200,"value":"7"}]`), "not an object of numbers"},
		{"read attribute missing", read(`[{"status":200,"value":{"MessageCount":1}}]`), "no ConsumerCount"},
		{"read attribute a string", read(`[{"status":200,"value":{"MessageCount":"many","ConsumerCount":1}}]`), "not an object of numbers"},
		{"read attribute fractional", read(`[{"status":200,"value":{"MessageCount":1.5,"ConsumerCount":1}}]`), "not a count"},
		{"read attribute negative", read(`[{"status":200,"value":{"MessageCount":-1,"ConsumerCount":1}}]`), "not a count"},
		{"too long", search(`[{"status":200,"value":["` + strings.Repeat("x", 2000) + `"]}]`), "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				var reqs []jolokia.Request
				_ = json.NewDecoder(r.Body).Decode(&reqs)
				typ := ""
				if len(reqs) > 0 {
					typ = reqs[0].Type
				}
				status, body := tc.answer(typ)
				if status == 302 {
					w.Header().Set("Location", "/login")
				}
				w.WriteHeader(status)
				fmt.Fprint(w, body)
			}))
			defer srv.Close()
			c := client(t, srv.URL, &countingGate{}, jolokia.Options{MaxAnswerBytes: 1000})
			qs, err := c.Queues(context.Background())
			var je *jolokia.Error
			if !errors.Is(err, jolokia.ErrNode) || !errors.Is(err, jolokia.ErrBadAnswer) || errors.Is(err, jolokia.ErrNoAnswer) || !errors.As(err, &je) {
				t.Fatalf("Queues = %v, %v; want an *Error matching ErrNode and ErrBadAnswer", qs, err)
			}
			if !strings.Contains(err.Error(), tc.reason) {
				t.Fatalf("error %q does not say %q", err, tc.reason)
			}
		})
	}
}

// TestNoAnswer: a node that refuses connections, or answers too late, is an
// *Error matching ErrNode and ErrNoAnswer; the caller's own context ending
// is not the node's fault.
func TestNoAnswer(t *testing.T) {
	t.Parallel()
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	_, err := client(t, closed.URL, &countingGate{}, jolokia.Options{}).Queues(context.Background())
	if !errors.Is(err, jolokia.ErrNode) || !errors.Is(err, jolokia.ErrNoAnswer) || errors.Is(err, jolokia.ErrBadAnswer) {
		t.Fatalf("refused connection: %v, want ErrNoAnswer", err)
	}

	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	defer close(release)
	start := time.Now()
	_, err = client(t, slow.URL, &countingGate{}, jolokia.Options{Timeout: 100 * time.Millisecond}).Queues(context.Background())
	if !errors.Is(err, jolokia.ErrNoAnswer) || !strings.Contains(err.Error(), "within 100ms") {
		t.Fatalf("slow node: %v, want ErrNoAnswer naming the timeout", err)
	}
	if waited := time.Since(start); waited > 2*time.Second {
		t.Fatalf("a 100 ms timeout returned after %v", waited)
	}

	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(50*time.Millisecond, cancel)
	_, err = client(t, slow.URL, &countingGate{}, jolokia.Options{Timeout: 10 * time.Second}).Queues(ctx)
	if errors.Is(err, jolokia.ErrNode) || !errors.Is(err, context.Canceled) {
		t.Fatalf("caller's context canceled: %v, want context.Canceled and not ErrNode", err)
	}
}

// TestGateRefusal: a call that gets no turn sends nothing.
func TestGateRefusal(t *testing.T) {
	t.Parallel()
	fn, srv := fakeNode(t, 3)
	_, err := client(t, srv.URL, &countingGate{refuse: noTurn(t)}, jolokia.Options{}).Queues(context.Background())
	if !errors.Is(err, nodelimit.ErrNoTurn) || errors.Is(err, jolokia.ErrNode) {
		t.Fatalf("refused turn: %v", err)
	}
	if st := fn.Stats(); st.Calls != 0 {
		t.Fatalf("the node received %d calls without a turn", st.Calls)
	}
}

func TestBasicAuth(t *testing.T) {
	t.Parallel()
	var got atomic.Value
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u, p, _ := r.BasicAuth()
		got.Store(u + ":" + p)
		fmt.Fprint(w, `[{"status":200,"value":[]}]`)
	}))
	defer srv.Close()
	if _, err := client(t, srv.URL, &countingGate{}, jolokia.Options{User: "admin", Password: "s3cret"}).Queues(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got.Load() != "admin:s3cret" {
		t.Fatalf("basic auth %v", got.Load())
	}
}

func TestParseObjectName(t *testing.T) {
	t.Parallel()
	on, err := jolokia.ParseObjectName(`org.apache.activemq.artemis:broker="b,1",component=addresses,address="a=\"x\"",subcomponent=queues,routing-type="anycast",queue="q:\\1\n\*"`)
	if err != nil {
		t.Fatal(err)
	}
	want := jolokia.ObjectName{Domain: "org.apache.activemq.artemis", Keys: map[string]string{
		"broker": "b,1", "component": "addresses", "address": `a="x"`, "subcomponent": "queues", "routing-type": "anycast", "queue": "q:\\1\n*",
	}}
	if diff := cmp.Diff(want, on); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	for _, v := range []string{"plain", `with "quotes"`, `back\slash`, "a,b=c:d", "new\nline", "*?"} {
		on, err := jolokia.ParseObjectName("d:k=" + jolokia.Quote(v))
		if err != nil || on.Keys["k"] != v {
			t.Errorf("Quote(%q) does not round-trip: %v, %v", v, on.Keys["k"], err)
		}
	}
	for _, bad := range []string{"", "nodomain", ":k=v", "d:", "d:k", "d:=v", "d:k=", "d:k=v,", "d:k=v,k=w", `d:k="v`, `d:k="v\"`,
		`d:k="v"x`, `d:k="\x"`, "d:k=a=b", "d:k=\"a\nb\"", "d:k*=v"} {
		if on, err := jolokia.ParseObjectName(bad); err == nil {
			t.Errorf("ParseObjectName(%q) = %+v, no error", bad, on)
		}
	}
}

func TestWriteError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		err    error
		status int
		slug   string
		retry  string
	}{
		{"unreachable", &jolokia.Error{Endpoint: "http://secret-host/jolokia/", Reason: "no answer", NoAnswer: true}, 502, jolokia.SlugUnreachable, ""},
		{"garbage", &jolokia.Error{Endpoint: "http://secret-host/jolokia/", Reason: "HTTP status 500"}, 502, jolokia.SlugUnreachable, ""},
		{"no turn", noTurn(t), 503, jolokia.SlugBusy, "1"},
		{"other", errors.New("secret-host exploded"), 500, "internal-error", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			jolokia.WriteError(rec, httptest.NewRequest(http.MethodGet, "/api/nodes/b1/queues", nil), slog.New(slog.DiscardHandler), "b1", fmt.Errorf("wrapped: %w", tc.err))
			var body map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
				t.Fatal(err)
			}
			typ, _ := body["type"].(string)
			if rec.Code != tc.status || !strings.HasSuffix(typ, ":"+tc.slug) || rec.Header().Get("Retry-After") != tc.retry {
				t.Fatalf("%d %v Retry-After %q; want %d %s %q", rec.Code, body, rec.Header().Get("Retry-After"), tc.status, tc.slug, tc.retry)
			}
			if rec.Header().Get("Content-Type") != "application/problem+json" || strings.Contains(rec.Body.String(), "secret-host") {
				t.Fatalf("body %s", rec.Body.String())
			}
		})
	}
}

func TestReadAll(t *testing.T) {
	t.Parallel()
	items := make([]int, 450)
	for i := range items {
		items[i] = i
	}
	var sizes []int
	got, err := jolokia.ReadAll(context.Background(), items, 0, func(_ context.Context, batch []int) ([]string, error) {
		sizes = append(sizes, len(batch))
		out := make([]string, len(batch))
		for i, v := range batch {
			out[i] = fmt.Sprint(v)
		}
		return out, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if !cmp.Equal(sizes, []int{200, 200, 50}) {
		t.Fatalf("batch sizes %v, want [200 200 50] (ReadsPerCall when size is 0)", sizes)
	}
	for i, s := range got {
		if s != fmt.Sprint(i) {
			t.Fatalf("result %d is %q: order not kept", i, s)
		}
	}
	if len(got) != 450 {
		t.Fatalf("%d results", len(got))
	}

	calls := 0
	none, err := jolokia.ReadAll(context.Background(), []int{}, 0, func(context.Context, []int) ([]int, error) { calls++; return nil, nil })
	if err != nil || len(none) != 0 || calls != 0 {
		t.Fatalf("no items: %v, %v, %d calls", none, err, calls)
	}

	boom := errors.New("boom")
	for _, tc := range []struct {
		name string
		read func(context.Context, []int) ([]int, error)
		want error
	}{
		{"short", func(_ context.Context, b []int) ([]int, error) { return b[1:], nil }, jolokia.ErrBatchLength},
		{"long", func(_ context.Context, b []int) ([]int, error) { return append(b, 0), nil }, jolokia.ErrBatchLength},
		{"error in the second batch", func(_ context.Context, b []int) ([]int, error) {
			if b[0] == 200 {
				return nil, boom
			}
			return b, nil
		}, boom},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := jolokia.ReadAll(context.Background(), items, 200, tc.read)
			if !errors.Is(err, tc.want) || got != nil {
				t.Fatalf("ReadAll = %d results, %v; want %v", len(got), err, tc.want)
			}
		})
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := jolokia.ReadAll(ctx, items, 200, func(_ context.Context, b []int) ([]int, error) { return b, nil }); !errors.Is(err, context.Canceled) {
		t.Fatalf("ended context: %v", err)
	}
}
