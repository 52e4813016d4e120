package main_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/ratelimit"
)

// heavyNames are the service's heavy endpoints with a request bob may
// make on each.
var heavyNames = []struct{ name, method, path string }{
	{"sql-console", http.MethodPost, "/api/sql"},
	{"audit-export", http.MethodGet, "/api/audit/export"},
	{"audit-history", http.MethodGet, "/api/audit?size=1"},
	{"event-history", http.MethodGet, "/api/events?size=1"},
	{"alert-history", http.MethodGet, "/api/alerts?size=1"},
	{"flow-graph", http.MethodGet, "/api/flow"},
}

// metricsFlags make every limit easy to reach: one of each heavy endpoint
// per user, two failed sign-ins, one upload an hour, and an installation
// cap (pool / 4 = 10) above the permits the test holds.
var metricsFlags = []string{"-sql-console-cap", "1", "-export-cap", "1", "-history-cap", "1", "-flow-cap", "1",
	"-export-rows", "10", "-pool-max-conns", "40", "-sign-in-failures", "2", "-uploads-per-hour", "1",
	"-api-rate", "1/h", "-api-burst", "20"}

// tokenID is the id the service counts a user's demo token by (its
// in-flight key; the rate's key is "user:" and the user's name, every token
// of the user together).
func tokenID(t *testing.T, pool *pgxpool.Pool, user string) string {
	t.Helper()
	var id int64
	if err := pool.QueryRow(context.Background(),
		`SELECT t.id FROM api_token t JOIN app_user u ON u.id = t.user_id WHERE u.username = $1 AND t.name = 'demo'`, user).Scan(&id); err != nil {
		t.Fatal(err)
	}
	return strconv.FormatInt(id, 10)
}

// holdPermit holds user's permit on the heavy endpoint name until the test
// ends, through pglimit's public API on the service's database, as another
// replica (named replica) would.
func holdPermit(t *testing.T, pool *pgxpool.Pool, name, user string, installationCap int, replica string) {
	t.Helper()
	ctx := context.Background()
	l, err := heavy.New(pool, heavy.Options{Name: name, Key: func(*http.Request) (string, bool) { return "", false },
		Limit: 1, InstallationLimit: installationCap, Replica: replica})
	if err != nil {
		t.Fatal(err)
	}
	p, err := l.Acquire(ctx, user)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Release(ctx) })
}

// refuseEveryLimit makes, against one replica, one refusal of each of the
// service's ten limits and a known number of grants. To make the refusals
// without waiting for anything, the test holds what the service counts
// through pglimit's own public API, on the same database: alice's permit
// on every heavy endpoint, all of bob's in-flight slots (last), and all
// of carol's rate. It returns what each limit decided.
func refuseEveryLimit(t *testing.T, base, dbURL string, dryRun bool) {
	t.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(t, dbURL, 4)
	for _, h := range heavyNames {
		holdPermit(t, pool, h.name, "alice", 10, "")
	}
	rate, err := ratelimit.New(pool, ratelimit.Options{Name: "api",
		Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour, Burst: 20}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rate.AcquireN(ctx, "user:carol", 20, nil); err != nil {
		t.Fatal(err)
	}

	// refused is the status of a refusal, or in dry run the status of the
	// route the request passes to.
	refused := func(route int) int {
		if dryRun {
			return route
		}
		return http.StatusTooManyRequests
	}
	expect := func(what string, r *response, want int) {
		t.Helper()
		if r.Status != want {
			t.Fatalf("%s: %d, want %d: %s", what, r.Status, want, r.Body)
		}
	}
	for _, h := range heavyNames {
		var body any
		if h.method == http.MethodPost {
			body = console("SELECT 1")
		}
		expect(h.name+" bob", call(t, h.method, base+h.path, "bob-token", body), http.StatusOK)
		expect(h.name+" alice", call(t, h.method, base+h.path, "alice-token", body), refused(http.StatusOK))
	}
	expect("upload 1", upload(t, base, "bob-token", "a.jar", []byte("plugin")), http.StatusCreated)
	expect("upload 2", upload(t, base, "bob-token", "b.jar", []byte("plugin b")), refused(http.StatusCreated))
	signIn := func() *response {
		return call(t, http.MethodPost, base+"/api/session", "", map[string]string{"username": "mallory", "password": "wrong"})
	}
	expect("sign-in 1", signIn(), http.StatusUnauthorized)
	expect("sign-in 2", signIn(), http.StatusUnauthorized)
	expect("sign-in 3", signIn(), refused(http.StatusUnauthorized))
	// In dry run the request passes the rate to its route: no such node.
	expect("api carol", call(t, http.MethodGet, base+"/api/nodes/none/queues", "carol-token", nil), refused(http.StatusNotFound))

	// As a replica does, the test's Limiter listens to the bus: the
	// service's replica holds a share of bob's slots, which it gives up
	// when a claim finds the rest full and asks for it.
	pgtest.Listen(t, pool)
	caps, err := inflight.New(pool, inflight.Options{Key: func(*http.Request) (string, bool) { return "", false }, Limit: 8})
	if err != nil {
		t.Fatal(err)
	}
	bob := tokenID(t, pool, "bob")
	for range 8 {
		p, err := caps.Acquire(ctx, bob)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.Release(ctx) })
	}
	expect("in-flight bob", call(t, http.MethodGet, base+"/api/nodes/none/queues", "bob-token", nil), refused(http.StatusNotFound))
}

// scrape reads /metrics.
func scrape(t *testing.T, base string) string {
	t.Helper()
	r := call(t, http.MethodGet, base+"/metrics", "", nil)
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("/metrics: %d %q", r.Status, r.Header.Get("Content-Type"))
	}
	return string(r.Body)
}

// sums adds up the series of the metric name in text by the values of
// the labels keys, joined by spaces (a label a series lacks is left out).
func sums(t *testing.T, text, name string, keys ...string) map[string]int64 {
	t.Helper()
	out := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		labels, value, ok := series(sc.Text(), name)
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			t.Fatalf("%q: %v", sc.Text(), err)
		}
		var parts []string
		for _, k := range keys {
			if v, ok := labels[k]; ok {
				parts = append(parts, v)
			}
		}
		out[strings.Join(parts, " ")] += n
	}
	return out
}

// series reads one Prometheus text line of the metric name: its labels
// and its value.
func series(line, name string) (map[string]string, string, bool) {
	rest, ok := strings.CutPrefix(line, name+"{")
	if !ok {
		return nil, "", false
	}
	inner, value, ok := strings.Cut(rest, "} ")
	if !ok {
		return nil, "", false
	}
	labels := map[string]string{}
	for _, kv := range strings.Split(inner, `",`) {
		k, v, _ := strings.Cut(kv, "=")
		labels[k] = strings.Trim(v, `"`)
	}
	return labels, value, true
}

// TestMetricsCountEveryLimit: after one refusal of each of the ten limits
// (and a known number of grants), /metrics says exactly that in
// pglimit_decisions_total, by limit, outcome and scope, with no user
// name, token or key in any label; with -dry-run all the same requests
// all pass, and every would-be refusal is counted dry-run-refused.
func TestMetricsCountEveryLimit(t *testing.T) {
	t.Parallel()
	for _, dryRun := range []bool{false, true} {
		t.Run(fmt.Sprintf("dry-run=%v", dryRun), func(t *testing.T) {
			t.Parallel()
			args := metricsFlags
			refused := "refused"
			if dryRun {
				args = append(append([]string{}, metricsFlags...), "-dry-run", "all")
				refused = "dry-run-refused"
			}
			procs, dbURL := studio(t, 1, args...)
			refuseEveryLimit(t, procs[0].URL, dbURL, dryRun)
			text := scrape(t, procs[0].URL)

			want := map[string]int64{}
			for _, h := range heavyNames {
				want[h.name+" granted user"] = 1 // bob's
				want[h.name+" "+refused+" user"] = 1
			}
			want["uploads granted user"] = 1
			want["uploads "+refused+" user"] = 1
			want["sign-in granted user"] = 2
			want["sign-in "+refused+" user"] = 1
			// The three sign-ins meet their client address's throttle
			// first: it grants all three (the third, refused by its
			// username, gives the address's attempt back).
			want["sign-in-address granted key"] = 3
			// Inside the pair's, the username's over every client: the
			// two the pair granted (in dry run all three go on).
			usernameChecks := int64(2)
			if dryRun {
				usernameChecks = 3
			}
			want["sign-in-username granted user"] = usernameChecks
			// Every request with a token passes the rate first: bob's 6
			// heavy, alice's 6, bob's 2 uploads, carol's, bob's last.
			want["api granted key"] = 15
			want["api "+refused+" key"] = 1
			// What passed the rate reaches the in-flight cap (carol's too,
			// in dry run).
			want["in-flight granted token"] = 14
			if dryRun {
				want["in-flight granted token"] = 15
			}
			want["in-flight "+refused+" token"] = 1
			// The three sign-ins have no token: they pass their client
			// address's rate first.
			want["address granted key"] = 3
			if diff := cmp.Diff(want, sums(t, text, "pglimit_decisions_total", "limit", "outcome", "scope")); diff != "" {
				t.Errorf("pglimit_decisions_total (-want +got):\n%s", diff)
			}
			// The database work of each decision: a claim or a check per
			// decision (releases and records go on after the answer).
			wantOps := map[string]int64{"sign-in check": 3, "uploads claim": 2, "api check": 16, "in-flight claim": want["in-flight granted token"] + 1,
				"address check": 3, "sign-in-address check": 3, "sign-in-username check": usernameChecks}
			for _, h := range heavyNames {
				wantOps[h.name+" claim"] = 2
			}
			gotOps := sums(t, text, "pglimit_decision_duration_seconds_count", "limit", "op")
			for op := range gotOps {
				if strings.HasSuffix(op, " release") || strings.HasSuffix(op, " record") {
					delete(gotOps, op)
				}
			}
			if diff := cmp.Diff(wantOps, gotOps); diff != "" {
				t.Errorf("pglimit_decision_duration_seconds_count (-want +got):\n%s", diff)
			}
			// History reads, all on the primary (no read replica).
			reads := sums(t, text, "pglimit_readroute_reads_total", "target")
			if reads["primary"] < 4 || len(reads) != 1 {
				t.Errorf("pglimit_readroute_reads_total %v, want primary reads only", reads)
			}
			for _, personal := range []string{"alice", "bob", "carol", "mallory", "-token"} {
				if strings.Contains(text, personal) {
					t.Errorf("/metrics names %q", personal)
				}
			}
		})
	}
}

// TestMetricsCountTheQuotas: the three quotas are counted in
// pglimit_decisions_total under their names (quota, export-rows,
// plugin-bytes), granted and refused, with scope key and no user name in
// any label: -api-quota 5/day admits bob's first five requests and
// refuses the sixth; -export-rows-per-day 1000 grants his first export
// (row cap 1000) and refuses the second; -plugin-bytes-per-month 100
// grants a plugin of 60 bytes and refuses the next of 60.
func TestMetricsCountTheQuotas(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-api-quota", "5/day", "-export-rows-per-day", "1000", "-export-rows", "1000",
		"-plugin-bytes-per-month", "100", "-api-rate", "0", "-token-in-flight", "100")
	base := procs[0].URL
	for i, want := range []int{http.StatusOK, http.StatusTooManyRequests} {
		if r := call(t, http.MethodGet, base+"/api/audit/export", "carol-token", nil); r.Status != want {
			t.Fatalf("carol's export %d: %d %.200s", i+1, r.Status, r.Body)
		}
	}
	for i, want := range []int{http.StatusCreated, http.StatusTooManyRequests} {
		if r := upload(t, base, "alice-token", fmt.Sprintf("m%d.jar", i), []byte(strings.Repeat(fmt.Sprint(i), 60))); r.Status != want {
			t.Fatalf("alice's upload %d: %d %.200s", i+1, r.Status, r.Body)
		}
	}
	for i := range 6 {
		want := http.StatusOK
		if i == 5 {
			want = http.StatusTooManyRequests
		}
		if r := call(t, http.MethodGet, base+"/api/limits/usage", "bob-token", nil); r.Status != want {
			t.Fatalf("bob's request %d: %d %.200s", i+1, r.Status, r.Body)
		}
	}
	text := scrape(t, base)
	got := sums(t, text, "pglimit_decisions_total", "limit", "outcome", "scope")
	for name, want := range map[string]int64{
		"export-rows granted key": 1, "export-rows refused key": 1,
		"plugin-bytes granted key": 1, "plugin-bytes refused key": 1,
		"quota refused key": 1,
	} {
		if got[name] != want {
			t.Errorf("pglimit_decisions_total %s = %d, want %d (all: %v)", name, got[name], want, got)
		}
	}
	// Every request of a token to an /api/ route is charged to its user's
	// quota first: carol's two exports, alice's two uploads, bob's five.
	if g := got["quota granted key"]; g != 9 {
		t.Errorf("pglimit_decisions_total quota granted key = %d, want 9", g)
	}
	for _, personal := range []string{"alice", "bob", "carol", "-token"} {
		if strings.Contains(text, personal) {
			t.Errorf("/metrics names %q", personal)
		}
	}
}
