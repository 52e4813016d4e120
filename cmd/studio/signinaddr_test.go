package main_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// signInFrom posts a sign-in to base from the loopback address local.
func signInFrom(t *testing.T, local, base, username, password string) *response {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"username": username, "password": password})
	r, err := sendFrom(context.Background(), local, http.MethodPost, base+"/api/session", "", "", b)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// scopeOf is the member scope of a 429 too-many-failed-sign-ins.
func scopeOf(t *testing.T, r *response) string {
	t.Helper()
	s, _ := r.problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")["scope"].(string)
	return s
}

// TestSignInAddressSpray: one password sprayed over 300 usernames from
// one client address (127.0.0.1), 20 at a time, over two replicas with
// the default -sign-in-address-failures (20): exactly 20 are judged (401)
// and 280 refused 429 too-many-failed-sign-ins with scope address; the
// observer, the database's login_attempt table, holds 20 failures for the
// address and a row for each of the 20 usernames judged, none for the
// others. Meanwhile another address (127.0.0.2) signs in on both
// replicas; from the sprayed address bob's right password is refused too.
// GET /api/limits lists the address's throttle with scope address. An
// operator's DELETE /api/limits/sign-in/address/127.0.0.1 on one replica
// (204, audit limits.reset) lets the address in on both: within a second
// on a quiet machine (logged); the test allows 10 s, as the username's
// reset test does, for a notification delayed by a loaded machine.
func TestSignInAddressSpray(t *testing.T) {
	t.Parallel()
	// -address-rate 0: the rate of requests without a token per address
	// (20/s by default) would refuse the spray before the throttle.
	procs, url := studio(t, 2, "-address-rate", "0", "-sign-in-window", "10m")
	const (
		n       = 300
		workers = 20
		limit   = 20
	)
	var (
		mu       sync.Mutex
		wg       sync.WaitGroup
		statuses = map[int]int{}
		scopes   = map[string]int{}
		next     = make(chan int)
	)
	for range workers {
		wg.Go(func() {
			for i := range next {
				b, _ := json.Marshal(map[string]string{"username": fmt.Sprintf("sprayed-%03d", i), "password": "Winter2026!"})
				r, err := sendFrom(context.Background(), clientIP, http.MethodPost, procs[i%2].URL+"/api/session", "", "", b)
				if err != nil {
					t.Error(err)
					return
				}
				var m struct{ Scope string }
				_ = json.Unmarshal(r.Body, &m)
				mu.Lock()
				statuses[r.Status]++
				if r.Status == http.StatusTooManyRequests {
					scopes[m.Scope]++
				}
				mu.Unlock()
			}
		})
	}
	start := time.Now()
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	t.Logf("%d usernames sprayed from one address over 2 replicas, %d at a time, in %v: statuses %v, refusal scopes %v",
		n, workers, time.Since(start).Round(time.Millisecond), statuses, scopes)
	if diff := cmp.Diff(map[int]int{401: limit, 429: n - limit}, statuses); diff != "" {
		t.Errorf("statuses (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(map[string]int{"address": n - limit}, scopes); diff != "" {
		t.Errorf("refusal scopes (-want +got):\n%s", diff)
	}
	obs := pgtest.Pool(t, url, 1)
	var addrFailures, userRows int
	if err := obs.QueryRow(context.Background(), `SELECT
		coalesce((SELECT failures FROM pglimit.login_attempt WHERE key = 'address:127.0.0.1'), 0),
		(SELECT count(*) FROM pglimit.login_attempt WHERE key LIKE 'username:sprayed-%')`).Scan(&addrFailures, &userRows); err != nil {
		t.Fatal(err)
	}
	if addrFailures != limit || userRows != limit {
		t.Errorf("login_attempt: the address has %d failures and %d usernames have a row, want %d and %d", addrFailures, userRows, limit, limit)
	}

	for i, p := range procs {
		if r := signInFrom(t, proxyIP, p.URL, "bob", "studio"); r.Status != http.StatusOK {
			t.Errorf("replica %d: bob from another address: %d %s", i, r.Status, r.Body)
		}
		if s := scopeOf(t, signInFrom(t, clientIP, p.URL, "bob", "studio")); s != "address" {
			t.Errorf("replica %d: bob from the sprayed address refused with scope %q, want address", i, s)
		}
	}

	var limits struct {
		Throttles []struct {
			Key, Scope string
			Failures   int
		}
	}
	if err := json.Unmarshal(call(t, http.MethodGet, procs[1].URL+"/api/limits", "alice-token", nil).Body, &limits); err != nil {
		t.Fatal(err)
	}
	listed := false
	for _, th := range limits.Throttles {
		if th.Key == "address:127.0.0.1" {
			listed = th.Scope == "address" && th.Failures == limit
		}
	}
	if !listed {
		t.Errorf("GET /api/limits does not list address:127.0.0.1 with scope address and %d failures: %+v", limit, limits.Throttles)
	}

	call(t, http.MethodDelete, procs[0].URL+"/api/limits/sign-in/address/127.0.0.1", "bob-token", nil).problemOf(t, http.StatusForbidden, "forbidden")
	start = time.Now()
	if r := call(t, http.MethodDelete, procs[0].URL+"/api/limits/sign-in/address/127.0.0.1", "alice-token", nil); r.Status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", r.Status, r.Body)
	}
	for i := range procs {
		i := 1 - i // the other replica first
		for {
			r := signInFrom(t, clientIP, procs[i].URL, "carol", "studio")
			if r.Status == http.StatusOK {
				t.Logf("replica %d let the address in %v after the reset", i, time.Since(start).Round(time.Millisecond))
				break
			}
			if s := scopeOf(t, r); s != "address" {
				t.Fatalf("replica %d after the reset: refused with scope %q", i, s)
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("replica %d still refuses the address %v after the reset", i, time.Since(start))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	audit := call(t, http.MethodGet, procs[1].URL+"/api/audit?size=5", "alice-token", nil)
	if !bytes.Contains(audit.Body, []byte(`"limits.reset"`)) || !bytes.Contains(audit.Body, []byte(`sign-in-address`)) || !bytes.Contains(audit.Body, []byte(`127.0.0.1`)) {
		t.Errorf("no limits.reset audit event for the address: %s", audit.Body)
	}
}

// TestSignInAddressAttackerWithAccount: an attacker with an account of its
// own (bob) sprays from one address over two replicas and signs in to its
// own account between wrong passwords: a successful sign-in does not clear
// the address's failures, so with -sign-in-address-failures 3 it still
// gets exactly 3 wrong passwords judged, and then its own account is
// refused from that address too (scope address). Were the address cleared
// by a success, every sign-in to bob would buy 3 more guesses.
func TestSignInAddressAttackerWithAccount(t *testing.T) {
	t.Parallel()
	procs, url := studio(t, 2, "-address-rate", "0", "-sign-in-address-failures", "3", "-sign-in-window", "10m")
	obs := pgtest.Pool(t, url, 1)
	addrFailures := func() (n int) {
		t.Helper()
		if err := obs.QueryRow(context.Background(),
			`SELECT coalesce((SELECT failures FROM pglimit.login_attempt WHERE key = 'address:127.0.0.1'), 0)`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	judged := 0
	for i := 0; i < 12; i++ {
		base := procs[i%2].URL
		if i%2 == 1 {
			r := signInFrom(t, clientIP, base, "bob", "studio")
			if judged < 3 {
				if r.Status != http.StatusOK {
					t.Fatalf("bob's own sign-in after %d wrong passwords: %d %s", judged, r.Status, r.Body)
				}
				if n := addrFailures(); n != judged {
					t.Fatalf("after bob's success the address has %d failures, want %d: a success cleared them", n, judged)
				}
				continue
			}
			if s := scopeOf(t, r); s != "address" {
				t.Fatalf("bob's own sign-in from the throttled address: scope %q, want address", s)
			}
			continue
		}
		r := signInFrom(t, clientIP, base, fmt.Sprintf("victim-%d", i), "Winter2026!")
		switch r.Status {
		case http.StatusUnauthorized:
			judged++
		case http.StatusTooManyRequests:
			if s := scopeOf(t, r); s != "address" {
				t.Fatalf("spray %d refused with scope %q", i, s)
			}
		default:
			t.Fatalf("spray %d: %d %s", i, r.Status, r.Body)
		}
	}
	t.Logf("%d wrong passwords judged with the attacker signing in to its own account between each (limit 3)", judged)
	if judged != 3 {
		t.Errorf("%d wrong passwords judged, want 3", judged)
	}
	if r := signInFrom(t, proxyIP, procs[0].URL, "bob", "studio"); r.Status != http.StatusOK {
		t.Errorf("bob from another address: %d %s", r.Status, r.Body)
	}
}

// TestSignInAddressResetBadInput: DELETE /api/limits/sign-in/address/{address}
// takes an IPv4 or IPv6 address, or an IPv6 prefix at least -ipv6-prefix
// long (as GET /api/limits lists it), and answers anything else 400
// invalid-address; it is for operators only (403 forbidden, 401 without a
// token), and 404 when the address throttle is off.
func TestSignInAddressResetBadInput(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-address-rate", "0")
	off, _ := studio(t, 1, "-address-rate", "0", "-sign-in-address-failures", "0")
	base := procs[0].URL + "/api/limits/sign-in/address/"
	for _, tc := range []struct {
		name, path, token string
		status            int
		slug              string
	}{
		{"IPv4", "192.0.2.1", "alice-token", 204, ""},
		{"IPv6", "2001:db8:1:2::5", "alice-token", 204, ""},
		{"IPv6 prefix as listed", "2001:db8:1:2::/64", "alice-token", 204, ""},
		{"IPv6 prefix escaped", "2001:db8:1:2::%2F64", "alice-token", 204, ""},
		{"IPv6 longer prefix", "2001:db8:1:2::/96", "alice-token", 204, ""},
		{"IPv4-mapped IPv6", "::ffff:192.0.2.1", "alice-token", 204, ""},
		{"loopback", "127.0.0.1", "alice-token", 204, ""},
		{"empty", "", "alice-token", 400, "invalid-address"},
		{"a name", "example.com", "alice-token", 400, "invalid-address"},
		{"an octet too large", "192.0.2.256", "alice-token", 400, "invalid-address"},
		{"three octets", "192.0.2", "alice-token", 400, "invalid-address"},
		{"with a port", "192.0.2.1:443", "alice-token", 400, "invalid-address"},
		{"bracketed IPv6 with a port", "[2001:db8::1]:443", "alice-token", 400, "invalid-address"},
		{"IPv4 CIDR", "10.0.0.0/8", "alice-token", 400, "invalid-address"},
		{"IPv6 prefix shorter than -ipv6-prefix", "2001:db8::/32", "alice-token", 400, "invalid-address"},
		{"IPv6 zone", "fe80::1%25eth0", "alice-token", 400, "invalid-address"},
		{"a key", "address:192.0.2.1", "alice-token", 400, "invalid-address"},
		{"a username", "carol", "alice-token", 400, "invalid-address"},
		{"trailing path", "192.0.2.1/x", "alice-token", 400, "invalid-address"},
		{"long", strings.Repeat("1", 200), "alice-token", 400, "invalid-address"},
		{"spaces", "%20192.0.2.1%20", "alice-token", 400, "invalid-address"},
		{"not an operator", "192.0.2.1", "bob-token", 403, "forbidden"},
		{"no token", "192.0.2.1", "", 401, "unauthorized"},
	} {
		r := call(t, http.MethodDelete, base+tc.path, tc.token, nil)
		if tc.slug == "" {
			if r.Status != tc.status {
				t.Errorf("%s (%q): %d %s, want %d", tc.name, tc.path, r.Status, r.Body, tc.status)
			}
			continue
		}
		if r.Status != tc.status || !bytes.Contains(r.Body, []byte(tc.slug)) {
			t.Errorf("%s (%q): %d %s, want %d %s", tc.name, tc.path, r.Status, r.Body, tc.status, tc.slug)
		}
	}
	r := call(t, http.MethodDelete, off[0].URL+"/api/limits/sign-in/address/192.0.2.1", "alice-token", nil)
	r.problemOf(t, http.StatusNotFound, "not-found")
	// Off: a spray from one address meets only the username's throttle.
	for i := range 25 {
		if r := signInFrom(t, clientIP, off[0].URL, fmt.Sprintf("u-%d", i), "x"); r.Status != http.StatusUnauthorized {
			t.Fatalf("the address throttle off: sign-in %d: %d %s", i, r.Status, r.Body)
		}
	}
}

// TestSignInAddressAllowList: the allow list exempts a client address from
// the address's sign-in throttle, over two replicas with
// -sign-in-address-failures 3. Without a rule, 127.0.0.1 has 3 wrong
// passwords judged (401) and is then refused (429 scope address) by both
// replicas. Within 10 s of an operator's allow rule for 127.0.0.1/32 (a
// second on a quiet machine; logged) both replicas judge its sign-ins
// again: 12 more wrong passwords over 12 usernames, far past the limit,
// are all 401, bob's right password is 200, and the observer, the
// database's login_attempt, still holds 3 failures for the address: the
// allowed sign-ins were neither refused nor counted. Another address on
// no list (127.0.0.2) meanwhile is held to its 3. Within 10 s of the
// rule's removal both replicas refuse 127.0.0.1 again. Every allowed
// sign-in is a decision of limit sign-in-address with outcome exempt in
// the replicas' metrics.
func TestSignInAddressAllowList(t *testing.T) {
	t.Parallel()
	procs, url := studio(t, 2, "-address-rate", "0", "-sign-in-address-failures", "3", "-sign-in-window", "10m")
	const limit = 3
	obs := pgtest.Pool(t, url, 1)
	addrFailures := func(addr string) (n int) {
		t.Helper()
		if err := obs.QueryRow(context.Background(),
			`SELECT coalesce((SELECT failures FROM pglimit.login_attempt WHERE key = $1), 0)`, "address:"+addr).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	seq := 0
	wrong := func(i int, from string) *response {
		t.Helper()
		seq++
		return signInFrom(t, from, procs[i].URL, fmt.Sprintf("allowlist-%s-%d", from, seq), "Winter2026!")
	}
	// exempted counts the sign-ins from 127.0.0.1 judged after it was
	// throttled: each was exempt.
	exempted := 0
	// waitBoth polls each replica with wrong passwords from 127.0.0.1
	// until one is answered as want says, for at most 10 s after since.
	waitBoth := func(what string, want func(*response) bool, since time.Time) {
		t.Helper()
		for i := range procs {
			for {
				r := wrong(i, clientIP)
				if r.Status == http.StatusUnauthorized {
					exempted++
				}
				if want(r) {
					break
				}
				if time.Since(since) > 10*time.Second {
					t.Fatalf("replica %d: %s not seen %v after the change: %d %s", i, what, time.Since(since), r.Status, r.Body)
				}
				time.Sleep(50 * time.Millisecond)
			}
		}
		t.Logf("%s on both replicas %v after the change", what, time.Since(since).Round(time.Millisecond))
	}
	refusedByAddress := func(r *response) bool {
		return r.Status == http.StatusTooManyRequests && scopeOf(t, r) == "address"
	}

	// No rule: held to the limit, then refused by both replicas.
	for i := range limit {
		if r := wrong(i%2, clientIP); r.Status != http.StatusUnauthorized {
			t.Fatalf("wrong password %d without a rule: %d %s", i, r.Status, r.Body)
		}
	}
	for i := range procs {
		if r := wrong(i, clientIP); !refusedByAddress(r) {
			t.Fatalf("replica %d: past the limit without a rule: %d %s, want 429 scope address", i, r.Status, r.Body)
		}
	}

	// The allow rule: judged again, uncounted.
	start := time.Now()
	added := call(t, http.MethodPost, procs[0].URL+"/api/limits/rules", "alice-token", map[string]any{"list": "allow", "match": "127.0.0.1/32"})
	if added.Status != http.StatusCreated {
		t.Fatalf("add the allow rule: %d %s", added.Status, added.Body)
	}
	rule := added.json(t)
	waitBoth("the allowed address judged", func(r *response) bool { return r.Status == http.StatusUnauthorized }, start)
	for i := range 12 {
		r := wrong(i%2, clientIP)
		if r.Status != http.StatusUnauthorized {
			t.Fatalf("allowed, wrong password %d (%d past the limit): %d %s, want 401", i, i+1, r.Status, r.Body)
		}
		exempted++
	}
	for i, p := range procs {
		if r := signInFrom(t, clientIP, p.URL, "bob", "studio"); r.Status != http.StatusOK {
			t.Errorf("replica %d: bob from the allowed address: %d %s", i, r.Status, r.Body)
		}
		exempted++
	}
	if n := addrFailures(clientIP); n != limit {
		t.Errorf("the allowed address has %d failures in login_attempt, want still %d", n, limit)
	}
	// Another address on no list: held to its limit all along.
	for i := range limit + 2 {
		r := wrong(i%2, proxyIP)
		if i < limit && r.Status != http.StatusUnauthorized {
			t.Fatalf("127.0.0.2, wrong password %d: %d %s", i, r.Status, r.Body)
		}
		if i >= limit && !refusedByAddress(r) {
			t.Errorf("127.0.0.2, on no list, past its limit: %d %s, want 429 scope address", r.Status, r.Body)
		}
	}
	if n := addrFailures(proxyIP); n != limit {
		t.Errorf("127.0.0.2 has %d failures, want %d", n, limit)
	}

	// The rule removed: refused again by both replicas.
	start = time.Now()
	if r := call(t, http.MethodDelete, fmt.Sprintf("%s/api/limits/rules/%v", procs[1].URL, rule["id"]), "alice-token", nil); r.Status != http.StatusNoContent {
		t.Fatalf("remove the allow rule: %d %s", r.Status, r.Body)
	}
	waitBoth("the address refused again", refusedByAddress, start)
	if n := addrFailures(clientIP); n != limit {
		t.Errorf("after the rule's removal the address has %d failures, want %d", n, limit)
	}

	var got int64
	for _, p := range procs {
		got += sums(t, string(call(t, http.MethodGet, p.URL+"/metrics", "", nil).Body), "pglimit_decisions_total", "limit", "outcome")["sign-in-address exempt"]
	}
	t.Logf("%d sign-ins from the allowed address judged past its limit of %d; %d decisions of sign-in-address with outcome exempt", exempted, limit, got)
	if got != int64(exempted) {
		t.Errorf("%d decisions of sign-in-address with outcome exempt, want %d (one per allowed sign-in)", got, exempted)
	}
}
