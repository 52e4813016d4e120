package signin_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// deviceKey is a random key of DeviceOptions.Keys.
func deviceKey(t testing.TB) []byte {
	t.Helper()
	k := make([]byte, 32)
	if _, err := rand.Read(k); err != nil {
		t.Fatal(err)
	}
	return k
}

// throttles is one replica's sign-in route: an address throttle (limit
// 20) around a pair throttle (5) around a username throttle over every
// client (8), reading the client address from X-Forwarded-For written
// by a proxy at 127.0.0.1, as a service behind one does.
func throttles(t testing.TB, pool *pgxpool.Pool, devices *signin.Devices, a http.Handler) http.Handler {
	t.Helper()
	addrs, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"127.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	opts := func(scope string, limit int) signin.Options {
		return signin.Options{Scope: scope, Limit: limit, Addresses: addrs, Devices: devices, Timeout: time.Minute}
	}
	return newLimiter(t, pool, opts("address", 20)).Handler(
		newLimiter(t, pool, opts("pair", 5)).Handler(
			newLimiter(t, pool, opts("username", 8)).Handler(a)))
}

// attempt is one sign-in through h from the client address from, with the
// cookies given.
func attempt(t testing.TB, h http.Handler, from, username, password string, cookies ...*http.Cookie) (response, []*http.Cookie) {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"username": username, "password": password})
	req := httptest.NewRequest(http.MethodPost, "/api/session", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Forwarded-For", from)
	req.RemoteAddr = "127.0.0.1:40000"
	for _, c := range cookies {
		req.AddCookie(c)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	res := rec.Result()
	return decode(t, res), res.Cookies()
}

// TestDeviceCookieAgainstLockout is OWASP's lockout attack and its answer,
// over two replicas (two pools on one database, each with the three
// throttles): carol signs in once from her laptop (198.51.100.7) and keeps
// the device cookie it sets; then an attacker fails for carol from 30
// addresses, five each and then more, spread over both replicas. The
// password checker (the observer, counting its own checks) checks what
// each counter allows and no more:
//
//   - each attacking address is held to the pair's 5 failures (scope
//     pair), and all of them together to the username's 8 (scope username:
//     a credential-stuffing run from many addresses is bounded for every
//     client without the cookie);
//   - carol, with her cookie, signs in with her password from her laptop and
//     from an address she never used, on either replica, while the
//     attacker's lockout stands; without it, she is refused (scope
//     username) like the attacker;
//   - a forged cookie (one byte changed), a cookie of another username and
//     a cookie signed with a key the replicas do not have count as none;
//   - a cookie that fails the pair's limit is itself locked out (scope
//     pair), from any address, while another device of carol's is not;
//   - Reset of carol on the pair throttle clears every pair of hers (rows
//     gone), and on the username throttle its count.
func TestDeviceCookieAgainstLockout(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool0 := pgtest.Pool(t, url, 4)
	devices, err := signin.NewDevices(signin.DeviceOptions{Keys: [][]byte{deviceKey(t)}})
	if err != nil {
		t.Fatal(err)
	}
	a := newApp(t, "carol", "alice")
	replicas := []http.Handler{throttles(t, pool0, devices, a), throttles(t, pgtest.Pool(t, url, 4), devices, a)}

	// Carol signs in from her laptop: 200 and a device cookie, Secure,
	// HttpOnly, SameSite=Strict.
	got, cookies := attempt(t, replicas[0], "198.51.100.7", "carol", rightPassword)
	if got.status != http.StatusOK || len(cookies) != 1 {
		t.Fatalf("carol's first sign-in: %d, cookies %v", got.status, cookies)
	}
	laptop := cookies[0]
	if !laptop.Secure || !laptop.HttpOnly || laptop.SameSite != http.SameSiteStrictMode || laptop.Path != "/" ||
		!strings.HasPrefix(laptop.Name, "__Host-pglimit_device_") || laptop.MaxAge <= 0 {
		t.Fatalf("device cookie %s: want Secure, HttpOnly, SameSite=Strict, Path /, a lifetime", laptop)
	}
	// Her tablet's, another device of hers.
	_, tabletCookies := attempt(t, replicas[1], "198.51.100.8", "carol", rightPassword)
	if len(tabletCookies) != 1 || tabletCookies[0].Name != laptop.Name || tabletCookies[0].Value == laptop.Value {
		t.Fatalf("carol's tablet's cookie: %v", tabletCookies)
	}
	tablet := tabletCookies[0]
	// Alice's cookie, for the cross-user check below.
	_, aliceCookies := attempt(t, replicas[1], "203.0.113.50", "alice", rightPassword)
	if len(aliceCookies) != 1 {
		t.Fatalf("alice's cookies: %v", aliceCookies)
	}

	// The attacker: 30 addresses, 7 wrong passwords each, over both
	// replicas.
	checkedBefore := a.evaluated.Load()
	scopes := map[string]int{}
	for i := range 30 {
		from := "192.0.2." + itoa(i+1)
		for j := range 7 {
			got, _ := attempt(t, replicas[(i+j)%2], from, "carol", "guess"+itoa(j))
			switch got.status {
			case http.StatusUnauthorized:
				scopes["checked"]++
			case http.StatusTooManyRequests:
				s, _ := got.body["scope"].(string)
				scopes[s]++
			default:
				t.Fatalf("attacker %s: %d %v", from, got.status, got.body)
			}
		}
	}
	checked := a.evaluated.Load() - checkedBefore
	t.Logf("attacker, 30 addresses × 7: %v; passwords checked %d", scopes, checked)
	if checked != 8 {
		t.Errorf("%d of the attacker's passwords checked; want the username's 8", checked)
	}
	if scopes["pair"] != 2 || scopes["username"] != 30*7-8-2 {
		t.Errorf("refusal scopes %v: want the first address's 6th and 7th by pair, every other by username", scopes)
	}

	// Carol, with her cookie, from her laptop and from a new address, on
	// both replicas: in. Without it: refused, scope username.
	for i, from := range []string{"198.51.100.7", "203.0.113.99"} {
		got, again := attempt(t, replicas[i%2], from, "carol", rightPassword, laptop)
		if got.status != http.StatusOK {
			t.Fatalf("carol with her cookie from %s: %d %v", from, got.status, got.body)
		}
		if len(again) != 1 || again[0].Name != laptop.Name {
			t.Fatalf("carol's cookie not set again: %v", again)
		}
		laptop = again[0]
	}
	if got, _ := attempt(t, replicas[1], "198.51.100.7", "carol", rightPassword); got.status != http.StatusTooManyRequests || got.body["scope"] != "username" {
		t.Fatalf("carol without her cookie: %d %v; want 429 scope username", got.status, got.body)
	}

	// Cookies that count as none.
	forged := *laptop
	forged.Value = flipMiddle(forged.Value)
	other := *aliceCookies[0]
	other.Name = laptop.Name // alice's cookie under carol's name
	strangers, err := signin.NewDevices(signin.DeviceOptions{Keys: [][]byte{deviceKey(t)}})
	if err != nil {
		t.Fatal(err)
	}
	var foreign *http.Cookie
	{
		h := throttles(t, pool0, strangers, a)
		_, c := attempt(t, h, "198.51.100.8", "alice", rightPassword)
		if len(c) != 1 {
			t.Fatalf("foreign cookie: %v", c)
		}
		foreign = c[0]
		foreign.Name = laptop.Name
	}
	for name, c := range map[string]*http.Cookie{"forged": &forged, "alice's": &other, "another key's": foreign} {
		if got, _ := attempt(t, replicas[0], "198.51.100.7", "carol", rightPassword, c); got.status != http.StatusTooManyRequests || got.body["scope"] != "username" {
			t.Errorf("carol with a %s cookie: %d %v; want 429 scope username", name, got.status, got.body)
		}
	}

	// A cookie that fails the pair's limit is locked out itself, from any
	// address; another device of carol's is not.
	phone := laptop // her laptop's cookie, stolen
	ctx := context.Background()
	usernameFailures := func() (n int) {
		t.Helper()
		if err := pool0.QueryRow(ctx, `SELECT coalesce(sum(failures), 0) FROM pglimit.login_attempt WHERE key = 'username:carol'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	failuresBefore := usernameFailures()
	for j := range 5 {
		if got, _ := attempt(t, replicas[j%2], "192.0.2."+itoa(100+j), "carol", "stolen"+itoa(j), phone); got.status != http.StatusUnauthorized {
			t.Fatalf("stolen cookie, attempt %d: %d %v", j, got.status, got.body)
		}
	}
	if got, _ := attempt(t, replicas[0], "192.0.2.200", "carol", rightPassword, phone); got.status != http.StatusTooManyRequests || got.body["scope"] != "pair" {
		t.Fatalf("a cookie past its pair's limit: %d %v; want 429 scope pair", got.status, got.body)
	}
	// Her tablet, another device, still signs in, from anywhere.
	if got, _ := attempt(t, replicas[1], "192.0.2.201", "carol", rightPassword, tablet); got.status != http.StatusOK {
		t.Fatalf("carol's tablet while her laptop's cookie is locked out: %d %v", got.status, got.body)
	}
	// The cookie's failures counted in its pair only, never toward the
	// username's count over every client.
	if after := usernameFailures(); after != failuresBefore || failuresBefore == 0 {
		t.Errorf("the username's failures went from %d to %d with a cookie's failures; want the attacker's, unchanged: a cookie holder is not counted there", failuresBefore, after)
	}

	// The operator's reset: every pair of carol's goes, and her count over
	// every client.
	pair := newLimiter(t, pool0, signin.Options{Scope: "pair", Limit: 5})
	if _, err := pair.Reset(ctx, " Carol "); err != nil {
		t.Fatal(err)
	}
	if _, err := newLimiter(t, pool0, signin.Options{Limit: 8}).Reset(ctx, "carol"); err != nil {
		t.Fatal(err)
	}
	var left int
	if err := pool0.QueryRow(ctx, `SELECT count(*) FROM pglimit.login_attempt WHERE key LIKE 'pair:carol|%' OR key = 'username:carol'`).Scan(&left); err != nil {
		t.Fatal(err)
	}
	if left != 0 {
		t.Errorf("%d rows of carol's after the reset, want none", left)
	}
	if got, _ := attempt(t, replicas[1], "192.0.2.1", "carol", rightPassword); got.status != http.StatusOK {
		t.Errorf("carol without a cookie after the reset: %d %v", got.status, got.body)
	}
}

// TestUnreadableAddressCountsNothing: a sign-in from the trusted proxy whose
// X-Forwarded-For names no client is refused 400
// client-address-unreadable, its password never checked and no row
// written; a Forwarded header the client added never changes the key.
func TestUnreadableAddressCountsNothing(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	a := newApp(t, "carol")
	h := throttles(t, pool, nil, a)
	for _, xff := range []string{"unknown", "", "127.0.0.2", "_hidden"} {
		got, _ := attempt(t, h, xff, "carol", "wrong")
		if got.status != http.StatusBadRequest || got.body["type"] != "urn:pglimit:problem:client-address-unreadable" {
			t.Errorf("X-Forwarded-For %q: %d %v; want 400 client-address-unreadable", xff, got.status, got.body)
		}
	}
	if n := a.evaluated.Load(); n != 0 {
		t.Errorf("%d passwords checked, want none", n)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Errorf("%d throttle rows, want none", rows)
	}
	// A Forwarded header never moves the key: the pair counted is the
	// X-Forwarded-For client's.
	b, _ := json.Marshal(map[string]string{"username": "carol", "password": "wrong"})
	req := httptest.NewRequest(http.MethodPost, "/api/session", bytes.NewReader(b))
	req.Header.Set("X-Forwarded-For", "198.51.100.3")
	req.Header.Set("Forwarded", "for=1.1.1.1")
	req.RemoteAddr = "127.0.0.1:1"
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("a wrong password: %d", rec.Code)
	}
	if n := failures(t, pool, "pair:carol|address:198.51.100.3"); n != 1 {
		t.Errorf("the pair of the X-Forwarded-For client has %d failures, want 1", n)
	}
	if n := failures(t, pool, "address:1.1.1.1"); n != 0 {
		t.Errorf("the address the client wrote into Forwarded has %d failures, want 0", n)
	}
}

// TestNewDevicesBadOptions: bad device options are errors at construction
// that name the field.
func TestNewDevicesBadOptions(t *testing.T) {
	t.Parallel()
	good := make([]byte, 32)
	for _, tc := range []struct {
		name string
		opts signin.DeviceOptions
		want string
	}{
		{"no keys", signin.DeviceOptions{}, "Keys"},
		{"a short key", signin.DeviceOptions{Keys: [][]byte{good, make([]byte, 31)}}, "Keys[1]"},
		{"nine keys", signin.DeviceOptions{Keys: [][]byte{good, good, good, good, good, good, good, good, good}}, "9 keys"},
		{"negative MaxAge", signin.DeviceOptions{Keys: [][]byte{good}, MaxAge: -time.Second}, "MaxAge"},
		{"a cookie name with a space", signin.DeviceOptions{Keys: [][]byte{good}, CookieName: "a b"}, "CookieName"},
		{"a cookie name with a semicolon", signin.DeviceOptions{Keys: [][]byte{good}, CookieName: "a;b"}, "CookieName"},
	} {
		d, err := signin.NewDevices(tc.opts)
		if err == nil || d != nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, %v; want an error naming %s", tc.name, d, err, tc.want)
		}
	}
}

func itoa(i int) string {
	const digits = "0123456789"
	if i < 10 {
		return digits[i : i+1]
	}
	return itoa(i/10) + digits[i%10:i%10+1]
}

// flipMiddle changes one character inside a base64url value (within the
// device's id) to another of the alphabet: a well-formed cookie whose tag
// no longer matches.
func flipMiddle(v string) string {
	const i = 20
	repl := byte('A')
	if v[i] == 'A' {
		repl = 'B'
	}
	return v[:i] + string(repl) + v[i+1:]
}

// TestPairResetTakesItsOwn: Reset of a username on the pair throttle
// clears every pair of that username and no other's: not those of a
// longer username it is a prefix of ("al" and "alice"), nor of one that
// starts with it and a "|" ("a" and "a|address:1.2.3.4"); and a username
// too long for its pair keys to be stored as they are (160 characters) is
// found and cleared too.
func TestPairResetTakesItsOwn(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	long := strings.Repeat("x", 160)
	names := []string{"al", "alice", "a", "a|address:1.2.3.4", long}
	a := newApp(t)
	h := throttles(t, pool, nil, a)
	for _, u := range names {
		for _, from := range []string{"198.51.100.1", "198.51.100.2"} {
			if got, _ := attempt(t, h, from, u, "wrong"); got.status != http.StatusUnauthorized {
				t.Fatalf("%q from %s: %d %v", u, from, got.status, got.body)
			}
		}
	}
	pairs := func() (n int) {
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt WHERE key LIKE 'pair:%'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := pairs(); n != 2*len(names) {
		t.Fatalf("%d pair rows, want %d", n, 2*len(names))
	}
	pair := newLimiter(t, pool, signin.Options{Scope: "pair", Limit: 5})
	for i, u := range []string{"al", "a", long} {
		got, err := pair.Reset(context.Background(), u)
		if err != nil || got != 2 {
			t.Fatalf("Reset(%.20q): %d failures, %v; want its 2", u, got, err)
		}
		if n := pairs(); n != 2*len(names)-2*(i+1) {
			t.Fatalf("after Reset(%.20q): %d pair rows, want %d: another username's were cleared", u, n, 2*len(names)-2*(i+1))
		}
	}
	for _, from := range []string{"198.51.100.1", "198.51.100.2"} {
		if got, _ := attempt(t, h, from, long, "wrong"); got.status != http.StatusUnauthorized {
			t.Fatalf("the long username after its reset: %d %v", got.status, got.body)
		}
	}
}
