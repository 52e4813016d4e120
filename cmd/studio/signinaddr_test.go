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

	"github.com/pglimit/pglimit/harness/pgtest"
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
