package ratelimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// tokenID stands in for the application's authentication: the bearer
// token's id, the only thing the limiter sees.
func tokenID(r *http.Request) (string, bool) {
	raw, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || raw == "" {
		return "", false
	}
	return "id-of-" + raw, true
}

// logBuffer is a slog handler's output the test can read while the limiter
// writes to it.
type logBuffer = observetest.Logs

func newLimiter(t testing.TB, pool *pgxpool.Pool, opts options) *limiter {
	t.Helper()
	if opts.Key == nil {
		opts.Key = tokenID
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	l, err := build(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// ok is the handler behind the limiter.
var ok = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusOK) })

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

func get(t testing.TB, h http.Handler, token string, header ...string) answer {
	t.Helper()
	r := markRequest(httptest.NewRequest(http.MethodGet, "/api/things", nil))
	if token != "" {
		r.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	a := answer{status: w.Code, header: w.Header()}
	if strings.HasPrefix(w.Header().Get("Content-Type"), "application/problem+json") {
		if err := json.Unmarshal(w.Body.Bytes(), &a.body); err != nil {
			t.Fatalf("problem body %q: %v", w.Body.String(), err)
		}
	}
	return a
}

// limits reads RateLimit-Policy and RateLimit as a client does, by
// policy name.
type policyHeader struct{ q, w, burst, r, t int64 }

func readHeaders(t testing.TB, h http.Header) map[string]policyHeader {
	t.Helper()
	out := map[string]policyHeader{}
	pol, err := parseSFList(h.Get("RateLimit-Policy"))
	if err != nil {
		t.Fatalf("%s: %v", "RateLimit-Policy", err)
	}
	lim, err := parseSFList(h.Get("RateLimit"))
	if err != nil {
		t.Fatalf("%s: %v", "RateLimit", err)
	}
	intParam := func(it sfItem, key string, required bool) int64 {
		v, found := it.param(key)
		if !found {
			if required {
				t.Errorf("%v: no parameter %q", it, key)
			}
			return -1
		}
		n, isInt := v.(int64)
		if !isInt || n < 0 {
			t.Errorf("%v: parameter %q is %v, not a non-negative integer", it, key, v)
		}
		return n
	}
	for _, it := range pol {
		name, isString := it.value.(sfString)
		if !isString {
			t.Fatalf("%s member %v: not a string", "RateLimit-Policy", it.value)
		}
		out[string(name)] = policyHeader{q: intParam(it, "q", true), w: intParam(it, "w", true),
			burst: intParam(it, "pglimit-burst", false)}
	}
	if len(lim) != len(pol) {
		t.Errorf("%d policies and %d limits", len(pol), len(lim))
	}
	for _, it := range lim {
		name, isString := it.value.(sfString)
		ph, known := out[string(name)]
		if !isString || !known {
			t.Fatalf("%s member %v: not a policy of %s", "RateLimit", it.value, "RateLimit-Policy")
		}
		ph.r, ph.t = intParam(it, "r", true), intParam(it, "t", true)
		out[string(name)] = ph
	}
	return out
}

// TestBurstThenRefusal: a key spends its burst with the remaining units
// counting down, is then refused with the exact Retry-After, and the
// refused requests spend nothing.
func TestBurstThenRefusal(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	policies := []ratelimit.Policy{{Name: "hourly", Limit: 5, Window: time.Hour}}
	l := newLimiter(t, pool, options{Policies: policies})
	ctx := context.Background()
	var recs []record
	for i := range 5 {
		p, err := l.Acquire(ctx, "alice")
		if err != nil {
			t.Fatalf("request %d: %v", i+1, err)
		}
		if got := p.Policies[0].Remaining; got != 4-i {
			t.Errorf("request %d: remaining %d, want %d", i+1, got, 4-i)
		}
		if got := p.Policies[0].Reset; got <= 0 || got > 12*time.Minute {
			t.Errorf("request %d: reset %v, want within (0, 12m]: one unit is 12 minutes", i+1, got)
		}
		recs = append(recs, record{at: micro(p.At), cost: 1, admitted: true})
	}
	for range 3 {
		_, err := l.Acquire(ctx, "alice")
		var le *ratelimit.LimitError
		if !errors.As(err, &le) || !errors.Is(err, pglimit.ErrLimited) {
			t.Fatalf("after the burst: %v, want a *LimitError matching pglimit.ErrLimited", err)
		}
		if le.Policies[0].Remaining != 0 || !cmp.Equal(le.Violated, []string{"hourly"}) || le.Limit != 5 {
			t.Errorf("refusal %+v", le)
		}
		if le.RetryAfter <= 11*time.Minute || le.RetryAfter > 12*time.Minute {
			t.Errorf("RetryAfter %v: the first unit comes back 12 minutes after the first request", le.RetryAfter)
		}
		recs = append(recs, record{at: micro(le.At), cost: 1, retry: le.RetryAfter.Microseconds(), violated: le.Violated})
	}
	holds(t, judge(policies, recs))
	// Another key is untouched.
	if _, err := l.Acquire(ctx, "bob"); err != nil {
		t.Errorf("bob: %v", err)
	}
}

// TestHandlerHeaders: every admitted response carries RateLimit-Policy
// and RateLimit, which parse as RFC 9651 lists with draft-11's parameters;
// a refusal is 429 too-many-requests with limit, retryAfter,
// violated-policies and a Retry-After equal to retryAfter; no header or
// body carries the key.
func TestHandlerHeaders(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	h := newLimiter(t, pool, options{Policies: []ratelimit.Policy{
		{Name: "api", Limit: 3, Window: time.Minute, Burst: 2},
		{Name: "daily", Limit: 100, Window: 24 * time.Hour},
	}}).Handler(ok)
	token := "s3cr3t-token"
	for i := range 2 {
		a := get(t, h, token)
		if a.status != http.StatusOK {
			t.Fatalf("request %d: %d %v", i+1, a.status, a.body)
		}
		got := readHeaders(t, a.header)
		want := map[string]policyHeader{
			"api":   {q: 3, w: 60, burst: 2, r: int64(1 - i), t: 20},
			"daily": {q: 100, w: 86400, burst: -1, r: int64(99 - i), t: 864},
		}
		if diff := cmp.Diff(want, got, cmp.AllowUnexported(policyHeader{})); diff != "" {
			t.Errorf("request %d headers (-want +got):\n%s", i+1, diff)
		}
	}
	a := get(t, h, token)
	if a.status != http.StatusTooManyRequests {
		t.Fatalf("third request: %d, want 429", a.status)
	}
	if typ, _ := a.body["type"].(string); !strings.HasSuffix(typ, ":"+"too-many-requests") {
		t.Errorf("type %q", typ)
	}
	retry, _ := a.body["retryAfter"].(float64)
	if retry < 19 || retry > 20 || a.header.Get("Retry-After") != strconv.Itoa(int(retry)) {
		t.Errorf("retryAfter %v, Retry-After %q: a unit of 3/min comes back within 20 s", a.body["retryAfter"], a.header.Get("Retry-After"))
	}
	if a.body["limit"] != float64(3) || !cmp.Equal(a.body["violated-policies"], []any{"api"}) {
		t.Errorf("members limit %v, violated-policies %v", a.body["limit"], a.body["violated-policies"])
	}
	refused := readHeaders(t, a.header)
	if refused["api"].r != 0 || refused["daily"].r != 98 {
		t.Errorf("refusal headers %+v: the refused request spends nothing", refused)
	}
	if secs := refused["api"].t; float64(secs) > retry {
		t.Errorf("t=%d after Retry-After %v: draft-11 wants Retry-After no sooner than t", secs, retry)
	}
	for name, vs := range a.header {
		if strings.Contains(strings.Join(vs, " "), token) {
			t.Errorf("header %s carries the key: %v", name, vs)
		}
	}
	raw, _ := json.Marshal(a.body)
	if strings.Contains(string(raw), token) {
		t.Errorf("the body carries the key: %s", raw)
	}
}

// TestUnidentifiedPasses: a request the key function cannot identify
// passes uncounted, without headers.
func TestUnidentifiedPasses(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	h := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}}}).Handler(ok)
	for range 3 {
		a := get(t, h, "")
		if a.status != http.StatusOK || a.header.Get("RateLimit") != "" {
			t.Fatalf("unidentified: %d %v", a.status, a.header)
		}
	}
	if n := rows(t, pool); n != 0 {
		t.Errorf("%d rows for unidentified requests", n)
	}
}

func rows(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.api_request_window`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestPolicyFunc: a request's policies come from the caller's plan, read
// per request: a key that moves to a larger plan is held to it at once;
// none lets the request pass uncounted; an invalid one is a 500 without
// the error's text.
func TestPolicyFunc(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	logs := &logBuffer{}
	plans := map[string][]ratelimit.Policy{
		"free": {{Name: "free", Limit: 2, Window: time.Hour}},
		"gold": {{Name: "gold", Limit: 100, Window: time.Hour}},
		"bad":  {{Name: "bad name", Limit: 1, Window: time.Hour}},
	}
	h := newLimiter(t, pool, options{
		Logger: slog.New(slog.NewTextHandler(logs, nil)),
		PolicyFunc: func(r *http.Request, key string) []ratelimit.Policy {
			return plans[r.Header.Get("Plan")]
		},
	}).Handler(ok)
	for i, want := range []int{200, 200, 429} {
		if a := get(t, h, "t1", "Plan", "free"); a.status != want {
			t.Fatalf("free request %d: %d, want %d", i+1, a.status, want)
		}
	}
	a := get(t, h, "t1", "Plan", "gold")
	if a.status != http.StatusOK || readHeaders(t, a.header)["gold"].r != 99 {
		t.Errorf("after the upgrade: %d %v", a.status, a.header)
	}
	if a := get(t, h, "t1"); a.status != http.StatusOK || a.header.Get("RateLimit-Policy") != "" {
		t.Errorf("no plan: %d %v", a.status, a.header)
	}
	a = get(t, h, "t1", "Plan", "bad")
	if a.status != http.StatusInternalServerError || strings.Contains(a.body["detail"].(string), "bad name") {
		t.Errorf("invalid policy: %d %v", a.status, a.body)
	}
	if logs.Count("PolicyFunc") != 1 {
		t.Errorf("the invalid policy is logged once: %q", logs.String())
	}
}

// TestCost: a request spends what Cost says; one that costs more than
// the burst can never pass, is refused without Retry-After and without a
// round trip.
func TestCost(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	h := newLimiter(t, pool, options{
		Policies: []ratelimit.Policy{{Name: "units", Limit: 5, Window: time.Hour}},
		Cost: func(r *http.Request) int {
			n, _ := strconv.Atoi(r.Header.Get("Cost"))
			return n
		},
	}).Handler(ok)
	a := get(t, h, "big", "Cost", "6")
	if a.status != http.StatusTooManyRequests || a.header.Get("Retry-After") != "" || a.body["retryAfter"] != nil {
		t.Errorf("cost above the burst: %d Retry-After %q %v", a.status, a.header.Get("Retry-After"), a.body)
	}
	if n := rows(t, pool); n != 0 {
		t.Errorf("a request that can never pass made %d rows", n)
	}
	if a := get(t, h, "t", "Cost", "3"); a.status != 200 || readHeaders(t, a.header)["units"].r != 2 {
		t.Errorf("cost 3 of 5: %d %v", a.status, a.header)
	}
	if a := get(t, h, "t", "Cost", "3"); a.status != 429 || a.body["retryAfter"] == nil {
		t.Errorf("cost 3 with 2 left: %d %v", a.status, a.body)
	}
	if a := get(t, h, "t", "Cost", "2"); a.status != 200 || readHeaders(t, a.header)["units"].r != 0 {
		t.Errorf("cost 2 with 2 left (the refused 3 spent nothing): %d %v", a.status, a.header)
	}
	if a := get(t, h, "t", "Cost", "0"); a.status != 200 || readHeaders(t, a.header)["units"].r != 0 {
		t.Errorf("cost 0 reads the state: %d %v", a.status, a.header)
	}
	if a := get(t, h, "t", "Cost", "-1"); a.status != http.StatusInternalServerError {
		t.Errorf("negative cost: %d", a.status)
	}
}

// decisions reads pglimit.decisions by outcome.
func decisions(t testing.TB, meter *observetest.Meter) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	for _, p := range meter.Points() {
		if !p.Counter {
			continue
		}
		key := p.Name
		if o, found := p.Attributes.Value("outcome"); found {
			key += "/" + o.AsString()
		}
		if f, found := p.Attributes.Value("fail"); found {
			key += "/" + f.AsString()
		}
		out[key] += p.Sum
	}
	return out
}

// TestDryRun: in dry run a request that would be refused passes with the
// headers, spends nothing, is counted dry-run-refused and logged.
func TestDryRun(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	meter := observetest.New()
	logs := &logBuffer{}
	policies := []ratelimit.Policy{{Name: "api", Limit: 2, Window: time.Hour}}
	l := newLimiter(t, pool, options{Policies: policies, DryRun: true,
		MeterProvider: meter,
		Logger:        slog.New(slog.NewTextHandler(logs, nil))})
	h := l.Handler(ok)
	for i := range 5 {
		a := get(t, h, "t")
		if a.status != http.StatusOK {
			t.Fatalf("request %d: %d", i+1, a.status)
		}
		if r := readHeaders(t, a.header)["api"].r; r != int64(max(1-i, 0)) {
			t.Errorf("request %d: r=%d", i+1, r)
		}
	}
	p, err := l.Acquire(context.Background(), "id-of-t")
	if err != nil || p.Refusal() == nil || p.Refusal().RetryAfter <= 0 {
		t.Fatalf("Acquire in dry run: %+v, %v: want a Permit carrying the refusal", p, err)
	}
	want := map[string]int64{"pglimit.decisions/granted": 2, "pglimit.decisions/dry-run-refused": 4}
	if diff := cmp.Diff(want, decisions(t, meter)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}
	if logs.Count("dry run: would refuse") != 1 || logs.Count("id-of-t") != 1 {
		t.Errorf("dry-run log (one line a second): %q", logs.String())
	}
	observetest.WaitRefusals(t, pool, map[string]int64{"api dry-run": 4})
	// Nothing was spent by the would-be refusals: the same state refuses
	// with the same limiter out of dry run, 1 h after the second request.
	strict := newLimiter(t, pool, options{Policies: policies})
	_, err = strict.Acquire(context.Background(), "id-of-t")
	var le *ratelimit.LimitError
	if !errors.As(err, &le) || le.RetryAfter < 29*time.Minute || le.RetryAfter > 30*time.Minute {
		t.Errorf("out of dry run: %v: the first unit comes back 30 min after the first request", err)
	}
}

// TestBadOptions: options that cannot work are refused by New.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	good := ratelimit.Policy{Name: "api", Limit: 10, Window: time.Second}
	for _, tc := range []struct {
		name string
		pool *pgxpool.Pool
		opts options
	}{
		{"nil pool", nil, options{Key: tokenID, Policies: []ratelimit.Policy{good}}},
		{"bad name", pool, options{Name: "api rate", Key: tokenID, Policies: []ratelimit.Policy{good}}},
		{"negative timeout", pool, options{Key: tokenID, Policies: []ratelimit.Policy{good}, Timeout: -1}},
		{"empty policy name", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Limit: 1, Window: time.Second}}}},
		{"quoted policy name", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: `a"b`, Limit: 1, Window: time.Second}}}},
		{"long policy name", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: strings.Repeat("a", 65), Limit: 1, Window: time.Second}}}},
		{"two of a name", pool, options{Key: tokenID, Policies: []ratelimit.Policy{good, good}}},
		{"zero limit", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Window: time.Second}}}},
		{"limit too large", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1000001, Window: time.Second}}}},
		{"no window", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1}}}},
		{"sub-second window", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: 500 * time.Millisecond}}}},
		{"fractional window", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: 1500 * time.Millisecond}}}},
		{"window too long", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: 400 * 24 * time.Hour}}}},
		{"negative burst", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: time.Second, Burst: -1}}}},
		{"burst too large", pool, options{Key: tokenID, Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: time.Second, Burst: 1000001}}}},
	} {
		if _, err := build(tc.pool, tc.opts); err == nil {
			t.Errorf("%s: New accepted %+v", tc.name, tc.opts)
		}
	}
	if _, err := build(pool, options{Key: tokenID, Policies: []ratelimit.Policy{good}}); err != nil {
		t.Errorf("good options: %v", err)
	}
	// The middleware's own: a Limiter, a Key, and policies from the
	// Limiter or PolicyFunc.
	withPolicies, err := ratelimit.New(pool, ratelimit.Options{Policies: []ratelimit.Policy{good}})
	if err != nil {
		t.Fatal(err)
	}
	without, err := ratelimit.New(pool, ratelimit.Options{})
	if err != nil {
		t.Fatalf("an engine without policies (each AcquireN names its own): %v", err)
	}
	for _, tc := range []struct {
		name string
		opts mratelimit.Options
		ok   bool
	}{
		{"no limiter", mratelimit.Options{Key: tokenID}, false},
		{"no key", mratelimit.Options{Limiter: withPolicies}, false},
		{"no policies anywhere", mratelimit.Options{Limiter: without, Key: tokenID}, false},
		{"policies from PolicyFunc", mratelimit.Options{Limiter: without, Key: tokenID,
			PolicyFunc: func(*http.Request, string) []ratelimit.Policy { return nil }}, true},
		{"policies from the Limiter", mratelimit.Options{Limiter: withPolicies, Key: tokenID}, true},
	} {
		if _, err := mratelimit.New(tc.opts); (err == nil) != tc.ok {
			t.Errorf("middleware %s: New returned %v", tc.name, err)
		}
	}
}

// TestAcquireBadInput: what Acquire cannot decide is an error, not a
// panic, and no row.
func TestAcquireBadInput(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	l := newLimiter(t, pool, options{PolicyFunc: func(*http.Request, string) []ratelimit.Policy { return nil }})
	ctx := context.Background()
	good := []ratelimit.Policy{{Name: "a", Limit: 1, Window: time.Second}}
	for _, tc := range []struct {
		name     string
		key      string
		cost     int
		policies []ratelimit.Policy
		is       error
	}{
		{"empty key", "", 1, good, nil},
		{"negative cost", "k", -1, good, pglimit.ErrInvalidCost},
		{"no policies at all", "k", 1, nil, ratelimit.ErrInvalidPolicy},
		{"empty policies", "k", 1, []ratelimit.Policy{}, ratelimit.ErrInvalidPolicy},
		{"invalid policy", "k", 1, []ratelimit.Policy{{Name: "a"}}, ratelimit.ErrInvalidPolicy},
		{"too many policies", "k", 1, make([]ratelimit.Policy, ratelimit.MaxPolicies+1), ratelimit.ErrInvalidPolicy},
	} {
		_, err := l.AcquireN(ctx, tc.key, tc.cost, tc.policies)
		if err == nil || (tc.is != nil && !errors.Is(err, tc.is)) {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
	if n := rows(t, pool); n != 0 {
		t.Errorf("%d rows", n)
	}
}

// TestKeysOfAnyText: keys PostgreSQL text cannot hold as they are (NUL,
// invalid UTF-8) or that are very long are counted, each apart.
func TestKeysOfAnyText(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "a", Limit: 1, Window: time.Hour}}})
	keys := []string{"nul\x00key", "nul\x00kez", "bad\xffutf8", strings.Repeat("k", 5000), strings.Repeat("k", 4999) + "j", "plain"}
	for _, k := range keys {
		if _, err := l.Acquire(context.Background(), k); err != nil {
			t.Errorf("key %q: %v", k[:min(len(k), 12)], err)
		}
		if _, err := l.Acquire(context.Background(), k); !errors.As(err, new(*ratelimit.LimitError)) {
			t.Errorf("key %q again: %v, want a refusal", k[:min(len(k), 12)], err)
		}
	}
	if n := rows(t, pool); n != len(keys) {
		t.Errorf("%d rows for %d keys", n, len(keys))
	}
}

// TestPolicySetChanges: a key judged by two policies and then by one
// keeps the other's state until it passes (the one-policy statement hands
// such a row to the general one), and the one-policy statement takes the
// key back once it has.
func TestPolicySetChanges(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "a", Limit: 10, Window: time.Hour}}})
	ctx := context.Background()
	both := []ratelimit.Policy{{Name: "a", Limit: 10, Window: time.Hour}, {Name: "b", Limit: 1, Window: 1 * time.Second}}
	if _, err := l.AcquireN(ctx, "k", 1, both); err != nil {
		t.Fatal(err)
	}
	stored := func() []string {
		var ps []string
		if err := pool.QueryRow(ctx, `SELECT policies FROM pglimit.api_request_window WHERE key = 'k'`).Scan(&ps); err != nil {
			t.Fatal(err)
		}
		return ps
	}
	p, err := l.Acquire(ctx, "k") // a alone, while b's state still counts
	if err != nil || p.Policies[0].Remaining != 8 {
		t.Fatalf("a alone: %+v %v", p, err)
	}
	if got := stored(); !cmp.Equal(got, []string{"a", "b"}) {
		t.Errorf("row policies %v: b's state is kept while it counts", got)
	}
	if _, err := l.AcquireN(ctx, "k", 1, both); !errors.As(err, new(*ratelimit.LimitError)) {
		t.Errorf("both again within b's second: %v, want a refusal by b", err)
	}
	time.Sleep(1100 * time.Millisecond)
	if _, err := l.Acquire(ctx, "k"); err != nil {
		t.Fatal(err)
	}
	if got := stored(); !cmp.Equal(got, []string{"a"}) {
		t.Errorf("row policies %v after b passed: want [a]", got)
	}
	p, err = l.Acquire(ctx, "k")
	if err != nil || p.Policies[0].Remaining != 6 {
		t.Errorf("a's count went on through both statements: %+v %v", p, err)
	}
}

// TestGenericPlan: both statements run on a generic plan, planned once per
// connection rather than on every execution (planning costs more than
// running them).
func TestGenericPlan(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	l := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "a", Limit: 1000, Window: time.Second}}})
	ctx := context.Background()
	two := []ratelimit.Policy{{Name: "a", Limit: 1000, Window: time.Second}, {Name: "b", Limit: 1000, Window: time.Minute}}
	for i := range 30 {
		key := "k" + strconv.Itoa(i%3)
		if _, err := l.Acquire(ctx, key); err != nil {
			t.Fatal(err)
		}
		if _, err := l.AcquireN(ctx, "two"+key, 1, two); err != nil {
			t.Fatal(err)
		}
	}
	rows, err := pool.Query(ctx, `
		SELECT generic_plans, custom_plans FROM pg_prepared_statements
		WHERE statement LIKE '%INSERT INTO pglimit.api_request_window%'
		  AND statement NOT LIKE '%pg_prepared_statements%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var generic, custom int64
		if err := rows.Scan(&generic, &custom); err != nil {
			t.Fatal(err)
		}
		n++
		if generic < 25 || custom > 5 {
			t.Errorf("a decision statement planned %d generic and %d custom plans in 30 runs", generic, custom)
		}
		t.Logf("generic plans %d, custom plans %d", generic, custom)
	}
	if n != 2 {
		t.Errorf("%d decision statements prepared on the connection, want 2", n)
	}
}

// TestDecisionsAreHOTUpdates: a key's row is rewritten by every decision
// without writing an index entry (a heap-only tuple update), which is
// what the table's lack of an index on expires_at buys.
func TestDecisionsAreHOTUpdates(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	l := newLimiter(t, pool, options{Policies: []ratelimit.Policy{{Name: "a", Limit: 10000, Window: time.Second}}})
	ctx := context.Background()
	for range 200 {
		if _, err := l.Acquire(ctx, "k"); err != nil {
			t.Fatal(err)
		}
	}
	// One connection: the decisions' statistics are this backend's, and
	// flushing them makes them visible to its next statement.
	if _, err := pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		t.Fatal(err)
	}
	var updates, hot int64
	if err := pool.QueryRow(ctx, `
		SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
		WHERE schemaname = 'pglimit' AND relname = 'api_request_window'`).Scan(&updates, &hot); err != nil {
		t.Fatal(err)
	}
	if updates < 199 || hot < updates*9/10 {
		t.Errorf("%d updates, %d of them HOT: want (almost) all HOT", updates, hot)
	}
}
