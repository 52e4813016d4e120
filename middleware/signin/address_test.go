package signin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/middleware/signin"
)

// signInFrom signs in through h from the peer address remote.
func signInFrom(t testing.TB, h http.Handler, remote, username, password string) response {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"username": username, "password": password})
	req := httptest.NewRequest(http.MethodPost, "/api/session", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.RemoteAddr = remote
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return decode(t, rec.Result())
}

// TestAddressSprayBurst: one password sprayed over 200 usernames from one
// client address, all at once, through three replicas (three pools, each
// with an address throttle of 10 around a username throttle of 5): the
// password checker — the observer, counting its own checks — checks
// exactly 10; the other 190 are refused 429 with scope address; the table
// holds 10 failures for the address and one for each of the 10 usernames
// checked, none for the others (the address refused them before the
// username throttle was asked).
func TestAddressSprayBurst(t *testing.T) {
	t.Parallel()
	const (
		n         = 200
		addrLimit = 10
	)
	url := pgtest.URL(t)
	a := newApp(t, "alice")
	a.delay = 20 * time.Millisecond // widens the race; a real bcrypt cost is slower still
	var servers []*httptest.Server
	pool0 := pgtest.Pool(t, url, 10)
	for i := range 3 {
		pool := pool0
		if i > 0 {
			pool = pgtest.Pool(t, url, 10)
		}
		// Timeout: 200 requests on 30 connections of a loaded machine may
		// wait longer than the default for a connection.
		h := newLimiter(t, pool, signin.Options{Scope: "address", Limit: addrLimit, Timeout: time.Minute}).Handler(
			newLimiter(t, pool, signin.Options{Limit: 5, Timeout: time.Minute}).Handler(a))
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	t.Cleanup(client.CloseIdleConnections)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		start    = make(chan struct{})
		statuses = map[int]int{}
		scopes   = map[string]int{}
	)
	for i := range n {
		wg.Go(func() {
			<-start
			b, _ := json.Marshal(map[string]string{"username": fmt.Sprintf("user-%03d", i), "password": "Summer2026!"})
			res, err := client.Post(servers[i%3].URL, "application/json", bytes.NewReader(b))
			code, scope := -1, ""
			if err == nil {
				got := decode(t, res)
				code = got.status
				if code == http.StatusTooManyRequests {
					scope, _ = got.body["scope"].(string)
				}
			}
			mu.Lock()
			statuses[code]++
			if scope != "" {
				scopes[scope]++
			}
			mu.Unlock()
		})
	}
	close(start)
	wg.Wait()
	t.Logf("%d usernames sprayed from one address over 3 replicas: %d passwords checked (address limit %d); statuses %v; refusal scopes %v",
		n, a.evaluated.Load(), addrLimit, statuses, scopes)
	if got := a.evaluated.Load(); got != addrLimit {
		t.Errorf("%d passwords checked, want exactly %d", got, addrLimit)
	}
	if diff := cmp.Diff(map[int]int{401: addrLimit, 429: n - addrLimit}, statuses); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"address": n - addrLimit}, scopes); diff != "" {
		t.Errorf("refusal scopes (-want +got):\n%s", diff)
	}
	if got := failures(t, pool0, "address:127.0.0.1"); got != addrLimit {
		t.Errorf("the address has %d failures, want %d", got, addrLimit)
	}
	var rows, total int
	if err := pool0.QueryRow(context.Background(),
		`SELECT count(*), coalesce(sum(failures), 0) FROM pglimit.login_attempt WHERE key LIKE 'username:%'`).Scan(&rows, &total); err != nil {
		t.Fatal(err)
	}
	if rows != addrLimit || total != addrLimit {
		t.Errorf("username rows %d with %d failures, want %d with one each", rows, total, addrLimit)
	}
}

// TestTwoKeysScopesAndGiveBack walks both keys on one replica (address
// limit 3, username limit 2) and reads the table after each step:
//
//   - a refusal by the username's throttle names scope username and gives
//     the address's attempt back (the address's count does not move);
//   - a request that is no attempt (the handler answers 400 or 500) gives
//     back both;
//   - the address's refusal names scope address, for a username that never
//     failed and a right password, and the handler never runs; another
//     address still signs in;
//   - an outcome the handler reports explicitly (FromContext) reaches the
//     address's throttle too;
//   - a success from an address with no failures leaves it no row;
//   - Acquire of an address key returns a *limit.Refusal with Scope address;
//     Reset of the address (as an operator types it) clears it.
func TestTwoKeysScopesAndGiveBack(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	const (
		attacker = "192.0.2.1:4000"
		other    = "198.51.100.2:4000"
	)
	a := newApp(t, "alice", "bob", "carol")
	var mode atomic.Value
	mode.Store("")
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load().(string) {
		case "400":
			respond.BadRequest(w, "invalid-request", "Invalid request", "No.")
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
		case "explicit":
			// A handler that reports a failure itself and answers 403.
			p, _ := signin.FromContext(r.Context())
			if err := p.Fail(r.Context()); err != nil {
				t.Error(err)
			}
			w.WriteHeader(http.StatusForbidden)
		default:
			a.ServeHTTP(w, r)
		}
	})
	addr := newLimiter(t, pool, signin.Options{Scope: "address", Limit: 3})
	user := newLimiter(t, pool, signin.Options{Limit: 2})
	th := addr.Handler(user.Handler(h))
	counts := func(step string, wantAddr, wantAlice int) {
		t.Helper()
		if got := failures(t, pool, "address:192.0.2.1"); got != wantAddr {
			t.Errorf("%s: the address has %d failures, want %d", step, got, wantAddr)
		}
		if got := failures(t, pool, "username:alice"); got != wantAlice {
			t.Errorf("%s: alice has %d failures, want %d", step, got, wantAlice)
		}
	}
	scopeOf := func(r response) string { s, _ := r.body["scope"].(string); return s }

	for range 2 {
		if r := signInFrom(t, th, attacker, "alice", "wrong"); r.status != http.StatusUnauthorized {
			t.Fatalf("a wrong password: %d %v", r.status, r.body)
		}
	}
	counts("two failures of alice", 2, 2)
	r := signInFrom(t, th, attacker, "alice", rightPassword)
	if r.status != http.StatusTooManyRequests || scopeOf(r) != "username" {
		t.Fatalf("alice throttled: %d %v, want 429 scope username", r.status, r.body)
	}
	counts("alice refused by her username", 2, 2)

	for _, m := range []string{"400", "500"} {
		mode.Store(m)
		if r := signInFrom(t, th, attacker, "bob", "x"); fmt.Sprint(r.status) != m {
			t.Fatalf("handler %s: %d", m, r.status)
		}
		if got := failures(t, pool, "username:bob"); got != 0 {
			t.Errorf("handler %s: bob has %d failures, want 0", m, got)
		}
		counts("a "+m+" (no attempt)", 2, 2)
	}
	mode.Store("explicit")
	if r := signInFrom(t, th, attacker, "bob", "x"); r.status != http.StatusForbidden {
		t.Fatalf("explicit: %d", r.status)
	}
	counts("bob's failure reported by the handler", 3, 2)
	if got := failures(t, pool, "username:bob"); got != 1 {
		t.Errorf("bob has %d failures, want 1", got)
	}
	mode.Store("")

	before := a.evaluated.Load()
	r = signInFrom(t, th, attacker, "carol", rightPassword)
	if r.status != http.StatusTooManyRequests || scopeOf(r) != "address" {
		t.Fatalf("the address throttled: %d %v, want 429 scope address", r.status, r.body)
	}
	retry := int(r.body["retryAfter"].(float64))
	want := map[string]any{
		"type":       "urn:pglimit:problem:too-many-failed-sign-ins",
		"title":      "Too many failed sign-ins",
		"status":     float64(429),
		"detail":     fmt.Sprintf("This client address had 3 failed sign-ins over every username; every sign-in from it is refused, whatever the username and password, for %d more seconds.", retry),
		"instance":   "/api/session",
		"limit":      float64(3),
		"retryAfter": float64(retry),
		"scope":      "address",
	}
	if diff := cmp.Diff(want, r.body); diff != "" || r.header.Get("Retry-After") != fmt.Sprint(retry) {
		t.Errorf("refusal by address, Retry-After %q (-want +got):\n%s", r.header.Get("Retry-After"), diff)
	}
	if a.evaluated.Load() != before {
		t.Error("the handler ran for a sign-in the address refused")
	}
	if got := failures(t, pool, "username:carol"); got != 0 {
		t.Errorf("carol has %d failures after the address refused her", got)
	}
	if r := signInFrom(t, th, other, "carol", rightPassword); r.status != http.StatusOK {
		t.Errorf("carol from another address: %d %v", r.status, r.body)
	}
	// Her success gave the other address's reservation back, and its row
	// of no failures went with it.
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt WHERE key = 'address:198.51.100.2'`).Scan(&rows); err != nil || rows != 0 {
		t.Errorf("the other address after a success: %d rows, %v; want none", rows, err)
	}

	_, err := addr.Acquire(context.Background(), "address:192.0.2.1")
	var le *limit.Refusal
	if !errors.As(err, &le) || le.Scope != "address" || le.Limit != 3 || le.Name != "sign-in-address" || !errors.Is(err, pglimit.ErrLimited) {
		t.Errorf("Acquire of the throttled address: %v (%+v)", err, le)
	}
	if _, err := user.Acquire(context.Background(), "username:alice"); !errors.As(err, &le) || le.Scope != "username" {
		t.Errorf("Acquire of the throttled username: %v", err)
	}
	for _, bad := range []string{"", "not an address", "10.0.0.0/8", "fe80::1%eth0", "192.0.2.1:4000"} {
		if _, err := addr.Reset(context.Background(), bad); !errors.Is(err, signin.ErrInvalidRequest) {
			t.Errorf("Reset(%q) = %v, want ErrInvalidRequest", bad, err)
		}
	}
	if n, err := addr.Reset(context.Background(), " 192.0.2.1 "); err != nil || n != 3 {
		t.Fatalf("Reset of the address: %d, %v; want its 3 failures", n, err)
	}
	if r := signInFrom(t, th, attacker, "carol", rightPassword); r.status != http.StatusOK {
		t.Errorf("carol from the reset address: %d %v", r.status, r.body)
	}
}

// TestAddressSuccessKeepsFailures: a successful sign-in clears its
// username's failures but not its address's — it gives back only its own
// attempt — so an attacker with an account of its own cannot reset its
// spray count by signing in to it between sprays: with an address limit
// of 4, the attacker's successes in between still leave it exactly 4
// wrong passwords, then every sign-in from its address is refused, its own
// account's too. IPv6 peers of one /64 are one address.
func TestAddressSuccessKeepsFailures(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	a := newApp(t, "mallory")
	for _, lenient := range []bool{false, true} {
		th := newLimiter(t, pool, signin.Options{Scope: "address", Limit: 4, Lenient: lenient}).Handler(
			newLimiter(t, pool, signin.Options{Limit: 3, Lenient: lenient}).Handler(a))
		peer := func(i int) string {
			return fmt.Sprintf("[2001:db8:0:%d::%x]:443", map[bool]int{false: 1, true: 2}[lenient], i+1)
		}
		key := map[bool]string{false: "address:2001:db8:0:1::/64", true: "address:2001:db8:0:2::/64"}[lenient]
		wrong := 0
		for i := 0; i < 20; i++ {
			if i%2 == 1 {
				if r := signInFrom(t, th, peer(i), "mallory", rightPassword); r.status != http.StatusOK {
					if r.status == http.StatusTooManyRequests && r.body["scope"] == "address" && wrong == 4 {
						break
					}
					t.Fatalf("lenient %v: mallory's own sign-in %d: %d %v", lenient, i, r.status, r.body)
				}
				if got := failures(t, pool, key); got != wrong {
					t.Fatalf("lenient %v: after mallory's success the address has %d failures, want %d", lenient, got, wrong)
				}
				continue
			}
			r := signInFrom(t, th, peer(i), fmt.Sprintf("victim-%d-%v", i, lenient), "Summer2026!")
			if r.status == http.StatusUnauthorized {
				wrong++
				continue
			}
			if r.status != http.StatusTooManyRequests || r.body["scope"] != "address" {
				t.Fatalf("lenient %v: spray %d: %d %v", lenient, i, r.status, r.body)
			}
		}
		t.Logf("lenient %v: %d wrong passwords checked with the attacker signing in to its own account between each", lenient, wrong)
		if wrong != 4 {
			t.Errorf("lenient %v: %d wrong passwords checked, want the address limit, 4", lenient, wrong)
		}
		if r := signInFrom(t, th, peer(99), "mallory", rightPassword); r.status != http.StatusTooManyRequests || r.body["scope"] != "address" {
			t.Errorf("lenient %v: mallory's own sign-in from the throttled /64: %d %v", lenient, r.status, r.body)
		}
	}
}

// TestAddressResetSeenByEveryReplica: an address throttled on two
// replicas (each refusing it from memory) is reset by an operator on one;
// the other lets it sign in again long before the throttle lapses (an
// hour): within a second on a quiet machine (logged); the test allows
// 10 s, as the username's reset test does, for a notification delayed by
// a loaded machine.
func TestAddressResetSeenByEveryReplica(t *testing.T) {
	t.Parallel()
	_, _, ls, _ := replicas(t, 2, signin.Options{Scope: "address", Limit: 2, Window: time.Hour})
	ctx := context.Background()
	const key = "address:203.0.113.9"
	fail(t, ls[0], key)
	fail(t, ls[1], key)
	for round := 0; round < 2; round++ {
		for i, l := range ls {
			_, err := l.Acquire(ctx, key)
			var le *limit.Refusal
			if !errors.As(err, &le) || le.Scope != "address" {
				t.Fatalf("replica %d: %v, want the address throttled", i, err)
			}
		}
	}
	start := time.Now()
	if n, err := ls[0].Reset(ctx, "203.0.113.9"); err != nil || n != 2 {
		t.Fatalf("Reset: %d, %v; want the 2 failures cleared", n, err)
	}
	for {
		p, err := ls[1].Acquire(ctx, key)
		if err == nil {
			_ = p.Release(ctx)
			t.Logf("the address admitted on the other replica %v after the reset", time.Since(start).Round(time.Millisecond))
			break
		}
		if !errors.Is(err, pglimit.ErrLimited) {
			t.Fatal(err)
		}
		if time.Since(start) > 10*time.Second {
			t.Fatalf("the other replica still refuses the address %v after the reset", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestAddressDefaultKey: the default address key is the peer's, never a
// forwarded header's, and only of a body the username key reads (a body
// without a username is 400 and writes nothing).
func TestAddressDefaultKey(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	th := newLimiter(t, pool, signin.Options{Scope: "address", Limit: 2}).Handler(newApp(t, "alice"))
	for i := range 3 {
		req := httptest.NewRequest(http.MethodPost, "/api/session", strings.NewReader(fmt.Sprintf(`{"username":"u%d","password":"x"}`, i)))
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		req.Header.Set("Forwarded", fmt.Sprintf("for=198.51.100.%d", i))
		req.RemoteAddr = "[::ffff:192.0.2.50]:1234"
		rec := httptest.NewRecorder()
		th.ServeHTTP(rec, req)
		if want := []int{401, 401, 429}[i]; rec.Code != want {
			t.Fatalf("sign-in %d: %d, want %d", i, rec.Code, want)
		}
	}
	if got := failures(t, pool, "address:192.0.2.50"); got != 2 {
		t.Errorf("the peer has %d failures, want 2", got)
	}
	req := httptest.NewRequest(http.MethodPost, "/api/session", strings.NewReader(`{"password":"x"}`))
	req.RemoteAddr = "192.0.2.51:1"
	rec := httptest.NewRecorder()
	th.ServeHTTP(rec, req)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("no username: %d, want 400", rec.Code)
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt WHERE key = 'address:192.0.2.51'`).Scan(&n); err != nil || n != 0 {
		t.Errorf("no username: %d rows, %v; want none", n, err)
	}
	if _, err := signin.New(pool, signin.Options{Scope: "ip"}); err == nil || !strings.Contains(err.Error(), "Scope") {
		t.Errorf("Scope ip: %v, want an error naming Scope", err)
	}
}
