package fakenode_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
)

func post(t *testing.T, h http.Handler, body string) (int, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/jolokia/", strings.NewReader(body)))
	return rec.Code, rec.Body.String()
}

func TestJolokiaSubset(t *testing.T) {
	t.Parallel()
	at := time.Unix(1_000_000, 0)
	n, err := fakenode.New(fakenode.Options{Queues: 3, Broker: "b1", Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	q2 := fakenode.MBean("b1", 2)
	for _, tc := range []struct{ name, body, want string }{
		{"search all", `[{"type":"search","mbean":"org.apache.activemq.artemis:broker=*,component=addresses,address=*,subcomponent=queues,routing-type=*,queue=*"}]`,
			`[{"status":200,"value":["` + esc(fakenode.MBean("b1", 1)) + `","` + esc(q2) + `","` + esc(fakenode.MBean("b1", 3)) + `"]}]`},
		{"search one", `[{"type":"search","mbean":"org.apache.activemq.artemis:broker=*,component=addresses,address=\"q2\",subcomponent=queues,routing-type=*,queue=*"}]`,
			`[{"status":200,"value":["` + esc(q2) + `"]}]`},
		{"search other domain", `[{"type":"search","mbean":"java.lang:type=*"}]`, `[{"status":200,"value":[]}]`},
		{"read", `[{"type":"read","mbean":"` + esc(q2) + `","attribute":["MessageCount","ConsumerCount"]}]`,
			`[{"status":200,"value":{"ConsumerCount":2,"MessageCount":6}}]`},
		{"read single object", `{"type":"read","mbean":"` + esc(q2) + `","attribute":"MessageCount"}`, `{"status":200,"value":{"MessageCount":6}}`},
		{"read unknown", `[{"type":"read","mbean":"d:k=v"}]`, `[{"status":404,"error":"d:k=v","error_type":"javax.management.InstanceNotFoundException"}]`},
		{"exec unsupported", `[{"type":"exec","mbean":"d:k=v"}]`, `[{"status":400,"error":"Unsupported type \"exec\"","error_type":"java.lang.IllegalArgumentException"}]`},
	} {
		code, got := post(t, n, tc.body)
		if code != 200 || strings.TrimSpace(got) != tc.want {
			t.Errorf("%s: %d %s\nwant %s", tc.name, code, got, tc.want)
		}
	}
	if code, got := post(t, n, `garbage`); code != 200 || !strings.Contains(got, `"status":400`) {
		t.Errorf("garbage: %d %s", code, got)
	}
	st := n.Stats()
	want := fakenode.Stats{Queues: 3, Calls: 8, ByKind: map[string]int64{"search": 3, "read": 3, "invalid": 2},
		Requests: map[string]int64{"search": 3, "read": 3, "exec": 1}, MaxRequestsPerCall: 1,
		PerSecond: []fakenode.Second{{Unix: 1_000_000, Calls: 8}}, MaxPerSecond: 8}
	if diff := cmp.Diff(want, st); diff != "" {
		t.Fatalf("stats (-want +got):\n%s", diff)
	}
	rec := httptest.NewRecorder()
	n.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/stats", nil))
	var decoded fakenode.Stats
	if err := json.Unmarshal(rec.Body.Bytes(), &decoded); err != nil || !cmp.Equal(decoded, want) {
		t.Fatalf("GET /stats: %s %v", rec.Body.String(), err)
	}
	n.Reset()
	if st := n.Stats(); st.Calls != 0 || len(n.Calls()) != 0 {
		t.Fatalf("after Reset: %+v", st)
	}
}

func TestPerSecondAndKeep(t *testing.T) {
	t.Parallel()
	at := time.Unix(2_000_000, 0)
	n, err := fakenode.New(fakenode.Options{Queues: 1, KeepCalls: 3, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	search := `[{"type":"search","mbean":"org.apache.activemq.artemis:queue=*"}]`
	for _, step := range []time.Duration{0, 300 * time.Millisecond, 800 * time.Millisecond, 60 * time.Second} {
		at = at.Add(step)
		post(t, n, search)
	}
	st := n.Stats()
	if !cmp.Equal(st.PerSecond, []fakenode.Second{{Unix: 2_000_001, Calls: 1}, {Unix: 2_000_061, Calls: 1}}) || st.MaxPerSecond != 2 {
		t.Fatalf("per second %+v max %d", st.PerSecond, st.MaxPerSecond)
	}
	if calls := n.Calls(); len(calls) != 3 || !calls[2].At.Equal(at) {
		t.Fatalf("kept calls %+v", calls)
	}
}

func TestBadOptionsAndRoutes(t *testing.T) {
	t.Parallel()
	for _, o := range []fakenode.Options{{Queues: -1}, {Delay: -time.Second}} {
		if _, err := fakenode.New(o); err == nil {
			t.Errorf("New(%+v): no error", o)
		}
	}
	n, _ := fakenode.New(fakenode.Options{})
	for _, tc := range []struct {
		method, path string
		code         int
	}{{"GET", "/jolokia/", 405}, {"GET", "/nope", 404}, {"POST", "/stats", 404}} {
		rec := httptest.NewRecorder()
		n.ServeHTTP(rec, httptest.NewRequest(tc.method, tc.path, nil))
		if rec.Code != tc.code {
			t.Errorf("%s %s: %d, want %d", tc.method, tc.path, rec.Code, tc.code)
		}
	}
}

func esc(s string) string { return strings.ReplaceAll(s, `"`, `\"`) }
