package signin_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// allowedHeader marks a request as on the allow list in these tests (the
// reference service asks middleware/rules.Allowed).
func allowedHeader(r *http.Request) bool { return r.Header.Get("X-Allowed") == "yes" }

// signInAllowed signs in through h from remote, marked allowed or not.
func signInAllowed(t testing.TB, h http.Handler, remote string, allowed bool, username, password string) response {
	t.Helper()
	return signInWith(t, h, remote, map[bool]string{true: "yes"}[allowed], username, password)
}

func signInWith(t testing.TB, h http.Handler, remote, allowed, username, password string) response {
	t.Helper()
	return signInFrom(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if allowed != "" {
			r.Header.Set("X-Allowed", allowed)
		}
		h.ServeHTTP(w, r)
	}), remote, username, password)
}

// TestAddressExempt: the address throttle with Options.Exempt, over two
// replicas (two pools of one database, the bus live on each, an address
// limit of 3 around a username limit of 5), in strict and lenient mode.
// Sign-ins it exempts are neither counted nor refused: 12 wrong passwords
// from an allowed address, over 12 usernames and both replicas, are all
// checked (401) and leave the address no row, so the same address, no
// longer allowed, still has its whole limit of 3 before it is refused;
// once it is throttled (refused on both replicas), its allowed sign-ins
// are still checked — 401 for a wrong password, 200 for a right one —
// and still leave its count at 3. The username's throttle inside it is
// not exempted: an allowed address still meets it. Each exemption is a
// decision with outcome exempt (scope key) in its replica's meter, with
// no statement of the address throttle (a tracer on each pool). A
// handler behind an exempting Limiter alone finds an exempt Permit whose
// explicit Fail counts nothing.
func TestAddressExempt(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var (
		pools   []*pgxpool.Pool
		tracers []*tracer
		meters  []*observetest.Meter
	)
	for range 2 {
		cfg, err := pgxpool.ParseConfig(url)
		if err != nil {
			t.Fatal(err)
		}
		tr := &tracer{}
		cfg.ConnConfig.Tracer = tr
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(pool.Close)
		pools, tracers = append(pools, pool), append(tracers, tr)
		meters = append(meters, observetest.New())
	}
	pgtest.Listen(t, pools...)
	a := newApp(t, "alice", "bob")
	for _, lenient := range []bool{false, true} {
		mode := map[bool]string{false: "strict", true: "lenient"}[lenient]
		addr := map[bool]string{false: "192.0.2.10", true: "192.0.2.20"}[lenient]
		remote := addr + ":4000"
		key := "address:" + addr
		var hs []http.Handler
		for i, pool := range pools {
			hs = append(hs, newLimiter(t, pool, signin.Options{Scope: "address", Limit: 3, Lenient: lenient,
				Exempt: allowedHeader, MeterProvider: meters[i]}).Handler(
				newLimiter(t, pool, signin.Options{Name: "sign-in-" + mode, Limit: 5, Lenient: lenient, MeterProvider: meters[i]}).Handler(a)))
		}

		// Allowed: 12 wrong passwords over 12 usernames, all checked,
		// none counted.
		before := a.evaluated.Load()
		for i := range 12 {
			if r := signInAllowed(t, hs[i%2], remote, true, fmt.Sprintf("sprayed-%s-%d", mode, i), "Winter2026!"); r.status != http.StatusUnauthorized {
				t.Fatalf("%s: allowed wrong password %d: %d %v, want 401", mode, i, r.status, r.body)
			}
		}
		if n := a.evaluated.Load() - before; n != 12 {
			t.Errorf("%s: %d of 12 allowed passwords checked", mode, n)
		}
		if rows := loginRows(t, pools[0], key); rows != 0 {
			t.Errorf("%s: the allowed address has %d rows in login_attempt, want none", mode, rows)
		}

		// No longer allowed: its whole limit is left, then it is refused
		// on both replicas.
		for i := range 3 {
			if r := signInAllowed(t, hs[i%2], remote, false, fmt.Sprintf("counted-%s-%d", mode, i), "Winter2026!"); r.status != http.StatusUnauthorized {
				t.Fatalf("%s: counted wrong password %d: %d %v, want 401 (the allowed ones spent its limit?)", mode, i, r.status, r.body)
			}
		}
		for i, h := range hs {
			r := signInAllowed(t, h, remote, false, "bob", rightPassword)
			if r.status != http.StatusTooManyRequests || r.body["scope"] != "address" {
				t.Fatalf("%s: replica %d: the throttled address not allowed: %d %v, want 429 scope address", mode, i, r.status, r.body)
			}
		}

		// Throttled, yet allowed: checked, not counted, on both replicas.
		for _, tr := range tracers {
			tr.take()
		}
		for i, h := range hs {
			if r := signInAllowed(t, h, remote, true, fmt.Sprintf("later-%s-%d", mode, i), "Winter2026!"); r.status != http.StatusUnauthorized {
				t.Errorf("%s: replica %d: an allowed wrong password from the throttled address: %d %v, want 401", mode, i, r.status, r.body)
			}
			if r := signInAllowed(t, h, remote, true, "bob", rightPassword); r.status != http.StatusOK {
				t.Errorf("%s: replica %d: bob allowed from the throttled address: %d %v, want 200", mode, i, r.status, r.body)
			}
		}
		if got := failures(t, pools[1], key); got != 3 {
			t.Errorf("%s: the address has %d failures after allowed sign-ins, want still 3", mode, got)
		}
		// What the replicas ran for those four sign-ins: the username
		// throttle's statements only (strict: a reservation each, and a
		// clear for bob's success; lenient: a read each, a write for each
		// failure, nothing for a success with none).
		want := map[bool][]string{
			false: {"LoginAttemptReserve", "LoginAttemptReserve", "LoginAttemptClear"},
			true:  {"LoginAttemptGet", "LoginAttemptRecordFailure", "LoginAttemptGet"},
		}[lenient]
		for i, tr := range tracers {
			if diff := cmp.Diff(want, throttleStatements(tr.take())); diff != "" {
				t.Errorf("%s: replica %d: statements of two allowed sign-ins (-want +got):\n%s", mode, i, diff)
			}
		}

		// The username's throttle still holds for an allowed address.
		user := "alice"
		for i := range 6 {
			r := signInAllowed(t, hs[i%2], remote, true, user, "wrong-"+mode)
			if i < 5 && r.status != http.StatusUnauthorized {
				t.Fatalf("%s: allowed wrong password %d of %s: %d %v", mode, i, user, r.status, r.body)
			}
			if i == 5 && (r.status != http.StatusTooManyRequests || r.body["scope"] != "username") {
				t.Errorf("%s: the sixth wrong password of %s, allowed: %d %v, want 429 scope username", mode, user, r.status, r.body)
			}
		}
		if _, err := pools[0].Exec(context.Background(), `DELETE FROM pglimit.login_attempt WHERE key = 'username:alice'`); err != nil {
			t.Fatal(err)
		}
	}
	// Per replica, per mode: 12/2 sprayed + 2 while throttled + 6/2 of
	// alice's (the sixth refused by her username's throttle inside) = 11
	// exemptions, and one refusal of the address.
	for i, m := range meters {
		d := m.Decisions(t)
		if got := d["sign-in-address exempt key"]; got != 2*11 {
			t.Errorf("replica %d: %d decisions with outcome exempt, want %d: %v", i, got, 2*11, d)
		}
		if got := d["sign-in-address refused key"]; got != 2 {
			t.Errorf("replica %d: %d refusals of the address, want 2 (one per mode): %v", i, got, d)
		}
	}

	// An exempting Limiter alone: the handler's Permit is exempt, and
	// what it reports counts nothing.
	const lone = "198.51.100.7"
	var exempt []bool
	h := newLimiter(t, pools[0], signin.Options{Scope: "address", Limit: 1, Exempt: allowedHeader}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			p, ok := signin.FromContext(r.Context())
			exempt = append(exempt, ok && p.Exempt())
			if err := p.Fail(r.Context()); err != nil {
				t.Error(err)
			}
			w.WriteHeader(http.StatusForbidden)
		}))
	for range 3 {
		if r := signInWith(t, h, lone+":1", "yes", "carol", "x"); r.status != http.StatusForbidden {
			t.Fatalf("allowed, the handler's own answer: %d %v", r.status, r.body)
		}
	}
	if rows := loginRows(t, pools[0], "address:"+lone); rows != 0 {
		t.Errorf("explicit failures of exempt Permits wrote %d rows", rows)
	}
	if r := signInWith(t, h, lone+":1", "", "carol", "x"); r.status != http.StatusForbidden {
		t.Fatalf("not allowed, the first attempt: %d %v", r.status, r.body)
	}
	if diff := cmp.Diff([]bool{true, true, true, false}, exempt); diff != "" {
		t.Errorf("Permit.Exempt in the handler (-want +got):\n%s", diff)
	}
	if got := failures(t, pools[0], "address:"+lone); got != 1 {
		t.Errorf("the address has %d failures after one counted failure, want 1", got)
	}
	var nilPermit *signin.Permit
	if nilPermit.Exempt() {
		t.Error("a nil Permit is exempt")
	}
}

// loginRows is the number of rows of key in login_attempt, lapsed or not.
func loginRows(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt WHERE key = $1`, key).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// throttleStatements are the statements of login_attempt in names (the
// invalidation bus's own are left out).
func throttleStatements(names []string) []string {
	var out []string
	for _, n := range names {
		if strings.HasPrefix(n, "LoginAttempt") {
			out = append(out, n)
		}
	}
	return out
}
