package signin_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/retryafter"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/problem"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

const rightPassword = "correct horse"

// app is the sign-in handler the tests wrap: it checks the password with
// bcrypt, against a dummy hash for unknown usernames, and answers 401 or
// 200 the same way for both. evaluated counts password checks.
type app struct {
	users     map[string][]byte
	dummy     []byte
	delay     time.Duration // added to every check, to widen races
	evaluated atomic.Int64
	// during runs inside the request after the check (e.g. to kill the
	// database), before the response is written.
	during func(r *http.Request, password string)
}

func newApp(t testing.TB, users ...string) *app {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte(rightPassword), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	dummy, _ := bcrypt.GenerateFromPassword([]byte("dummy password nobody has"), bcrypt.MinCost)
	a := &app{users: map[string][]byte{}, dummy: dummy}
	for _, u := range users {
		a.users[signin.NormalizeUsername(u)] = hash
	}
	return a
}

func (a *app) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req struct{ Username, Password string }
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		respond.BadRequest(w, "invalid-request", "Invalid request", "The body must be a JSON object.")
		return
	}
	hash, known := a.users[signin.NormalizeUsername(req.Username)]
	if !known {
		hash = a.dummy // same work for an unknown username: no enumeration by timing
	}
	a.evaluated.Add(1)
	err := bcrypt.CompareHashAndPassword(hash, []byte(req.Password))
	if a.delay > 0 {
		time.Sleep(a.delay)
	}
	if a.during != nil {
		a.during(r, req.Password)
	}
	if err != nil || !known {
		problem.Write(w, &problem.Details{Slug: "invalid-credentials", Title: "Invalid credentials",
			Status: http.StatusUnauthorized, Detail: "The username or the password is wrong."})
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"token":"t"}`)
}

func newLimiter(t testing.TB, pool *pgxpool.Pool, opts signin.Options) *signin.Limiter {
	t.Helper()
	l, err := signin.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func signIn(t testing.TB, h http.Handler, username, password string) response {
	t.Helper()
	b, _ := json.Marshal(map[string]string{"username": username, "password": password})
	req := httptest.NewRequest(http.MethodPost, "/api/session", bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return decode(t, rec.Result())
}

func decode(t testing.TB, res *http.Response) response {
	t.Helper()
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %q: %v", raw, err)
		}
	}
	return r
}

// wantThrottled is the refusal body for a limit, with retryAfter as the
// response's Retry-After says (checked separately).
func wantThrottled(limit int, retryAfter int) map[string]any {
	return map[string]any{
		"type":   "urn:pglimit:problem:too-many-failed-sign-ins",
		"title":  "Too many failed sign-ins",
		"status": float64(429),
		"detail": fmt.Sprintf("This username had %d failed sign-ins; every sign-in with it is refused, whatever the password, for %d more seconds.",
			limit, retryAfter),
		"instance":   "/api/session",
		"limit":      float64(limit),
		"retryAfter": float64(retryAfter),
		"scope":      "username",
	}
}

var wantInvalidCredentials = map[string]any{
	"type":   "urn:pglimit:problem:invalid-credentials",
	"title":  "Invalid credentials",
	"status": float64(401),
	"detail": "The username or the password is wrong.",
}

var wantUnavailable = map[string]any{
	"type":   "urn:pglimit:problem:sign-in-unavailable",
	"title":  "Service unavailable",
	"status": float64(503),
	"detail": "Sign-in is unavailable: the failed sign-in throttle cannot be reached. Try again shortly.",
}

// checkThrottled compares a refusal field by field and checks that
// Retry-After and retryAfter agree and lie in (window-slack, window].
func checkThrottled(t *testing.T, got response, limit int, window time.Duration) {
	t.Helper()
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429; body %v", got.status, got.body)
	}
	retry, err := strconv.Atoi(got.header.Get("Retry-After"))
	if err != nil {
		t.Fatalf("Retry-After %q: %v", got.header.Get("Retry-After"), err)
	}
	if w := int(window / time.Second); retry > w || retry < w-10 {
		t.Errorf("Retry-After %d, want about %d", retry, w)
	}
	if diff := cmp.Diff(wantThrottled(limit, retry), got.body); diff != "" {
		t.Errorf("refusal body (-want +got):\n%s", diff)
	}
	if ct := got.header.Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
}

func failures(t testing.TB, pool *pgxpool.Pool, key string) int {
	t.Helper()
	var n int
	err := pool.QueryRow(context.Background(), `SELECT failures FROM pglimit.login_attempt WHERE key = $1 AND expires_at > now()`, key).Scan(&n)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0
	}
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestThrottleAfterMaxFailures: five wrong passwords are judged (401), the
// sixth sign-in is refused although its password is right, and the handler
// never sees it.
func TestThrottleAfterMaxFailures(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	a := newApp(t, "alice")
	h := newLimiter(t, pool, signin.Options{Lenient: true}).Handler(a)
	for i := 1; i <= 5; i++ {
		got := signIn(t, h, "alice", "wrong")
		if got.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d: status %d, want 401", i, got.status)
		}
		if diff := cmp.Diff(wantInvalidCredentials, got.body); diff != "" {
			t.Fatalf("attempt %d (-want +got):\n%s", i, diff)
		}
		if n := failures(t, pool, "username:alice"); n != i {
			t.Fatalf("after %d failures the table counts %d", i, n)
		}
	}
	checkThrottled(t, signIn(t, h, "alice", rightPassword), 5, 15*time.Minute)
	checkThrottled(t, signIn(t, h, "ALICE ", "wrong"), 5, 15*time.Minute)
	if n := a.evaluated.Load(); n != 5 {
		t.Fatalf("%d passwords were checked, want 5", n)
	}
	if got := signIn(t, h, "bob", "wrong"); got.status != http.StatusUnauthorized {
		t.Fatalf("another username: status %d, want 401", got.status)
	}
}

// TestSuccessClearsFailures: a right password below the limit clears the
// failures, so the next five wrong ones are judged again.
func TestSuccessClearsFailures(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	a := newApp(t, "alice")
	h := newLimiter(t, pool, signin.Options{Lenient: true}).Handler(a)
	for i := 0; i < 4; i++ {
		signIn(t, h, "alice", "wrong")
	}
	got := signIn(t, h, "Alice", rightPassword)
	if diff := cmp.Diff(response{status: 200, body: map[string]any{"token": "t"}}, got,
		cmp.AllowUnexported(response{}), cmp.FilterPath(func(p cmp.Path) bool { return p.Last().String() == ".header" }, cmp.Ignore())); diff != "" {
		t.Fatalf("success (-want +got):\n%s", diff)
	}
	var rows int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt`).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	if rows != 0 {
		t.Fatalf("%d login_attempt rows left after a success", rows)
	}
	for i := 1; i <= 5; i++ {
		if got := signIn(t, h, "alice", "wrong"); got.status != http.StatusUnauthorized {
			t.Fatalf("attempt %d after the success: %d, want 401", i, got.status)
		}
	}
	checkThrottled(t, signIn(t, h, "alice", "wrong"), 5, 15*time.Minute)
}

// TestUsernamesAreNormalised: spellings of one username share one count.
func TestUsernamesAreNormalised(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ in, want string }{
		{"alice", "alice"},
		{"  Alice\t", "alice"},
		{"ALICE", "alice"},
		{"Straße", "strasse"},
		{"STRASSE", "strasse"},
		{"ＡＬＩＣＥ", "alice"}, // full-width
		{"Ǆemal", "džemal"},
		{"ΟΔΥΣΣΕΥΣ", "οδυσσευσ"},
		{"Όσος", "όσοσ"},
		{"\u3000bob\u3000", "bob"}, // ideographic spaces
		{"", ""},
		{"   ", ""},
	} {
		if got := signin.NormalizeUsername(tc.in); got != tc.want {
			t.Errorf("NormalizeUsername(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}

	pool, _ := pgtest.NewDB(t, 4)
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 3}).Handler(newApp(t, "alice"))
	for _, u := range []string{"alice", " ALICE", "Ａlice"} {
		if got := signIn(t, h, u, "wrong"); got.status != http.StatusUnauthorized {
			t.Fatalf("%q: %d", u, got.status)
		}
	}
	checkThrottled(t, signIn(t, h, "aLiCe", rightPassword), 3, 15*time.Minute)
}

// tracer counts the statements a pool runs (pgx.QueryTracer sees Exec,
// Query and QueryRow; pgx's own prepare/describe round trips are not
// queries and never reach it). Each statement is named by its sqlc name.
// The refusals per minute (RefusalMinuteAdd) are kept apart: they are
// written in the background, batched, at most about once a second, not by
// the sign-in that was refused.
type tracer struct {
	mu       sync.Mutex
	names    []string
	refusals int
}

func (tr *tracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := strings.TrimSpace(d.SQL)
	if rest, ok := strings.CutPrefix(name, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	}
	tr.mu.Lock()
	if name == "RefusalMinuteAdd" {
		tr.refusals++
	} else {
		tr.names = append(tr.names, name)
	}
	tr.mu.Unlock()
	return ctx
}

func (tr *tracer) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (tr *tracer) take() []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	out := tr.names
	tr.names = nil
	return out
}

func tracedPool(t testing.TB, url string) (*pgxpool.Pool, *tracer) {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tr := &tracer{}
	cfg.ConnConfig.Tracer = tr
	cfg.MaxConns = 2
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool, tr
}

// TestStatementCounts proves the cost the ADR states: a sign-in costs one
// read; a failed one adds one write; a success after failures one delete; a
// success with none writes nothing. Strict mode: the reservation, plus one
// write on success or when the request was not an attempt. Known and unknown
// usernames run the very same statements.
func TestStatementCounts(t *testing.T) {
	t.Parallel()
	const (
		get     = "LoginAttemptGet"
		failure = "LoginAttemptRecordFailure"
		clear   = "LoginAttemptClear"
		reserve = "LoginAttemptReserve"
		give    = "LoginAttemptUnreserve"
		notify  = "BusNotify"
	)
	pool, tr := tracedPool(t, pgtest.URL(t))
	a := newApp(t, "alice")
	normal := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 2}).Handler(a)
	strict := newLimiter(t, pool, signin.Options{Limit: 2, Lenient: false}).Handler(a)
	notAttempt := newLimiter(t, pool, signin.Options{Limit: 2, Lenient: false}).Handler(
		http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			respond.BadRequest(w, "invalid-request", "Invalid request", "Password missing.")
		}))
	steps := []struct {
		name     string
		h        http.Handler
		user     string
		password string
		status   int
		want     []string
	}{
		{"normal: success, no failures", normal, "alice", rightPassword, 200, []string{get}},
		{"normal: failure", normal, "alice", "wrong", 401, []string{get, failure}},
		{"normal: success after a failure", normal, "alice", rightPassword, 200, []string{get, clear}},
		{"normal: unknown user fails", normal, "mallory", "wrong", 401, []string{get, failure}},
		{"normal: known user fails", normal, "alice", "wrong", 401, []string{get, failure}},
		{"normal: unknown user fails again", normal, "mallory", "wrong", 401, []string{get, failure}},
		{"normal: known user fails again", normal, "alice", "wrong", 401, []string{get, failure}},
		{"normal: unknown user throttled", normal, "mallory", "wrong", 429, []string{get}},
		{"normal: known user throttled", normal, "alice", rightPassword, 429, []string{get}},
		{"strict: failure", strict, "carol", "wrong", 401, []string{reserve}},
		// The reservation took carol to the limit (2): another replica may
		// have refused her meanwhile and remembered it, so giving it back
		// tells the replicas.
		{"strict: not an attempt", notAttempt, "carol", "wrong", 400, []string{reserve, give, notify}},
		{"strict: success", strict, "carol", rightPassword, 401, []string{reserve}}, // carol is unknown: 401
		// A refused reservation returns no row; the row is read for when
		// the window ends (then remembered while the bus is live).
		{"strict: throttled", strict, "carol", rightPassword, 429, []string{reserve, get}},
	}
	a.users[signin.NormalizeUsername("dave")] = a.users["alice"]
	steps = append(steps,
		struct {
			name     string
			h        http.Handler
			user     string
			password string
			status   int
			want     []string
		}{"strict: success of a known user", strict, "dave", rightPassword, 200, []string{reserve, clear}})
	tr.take()
	for _, s := range steps {
		got := signIn(t, s.h, s.user, s.password)
		if got.status != s.status {
			t.Fatalf("%s: status %d, want %d", s.name, got.status, s.status)
		}
		if diff := cmp.Diff(s.want, tr.take()); diff != "" {
			t.Errorf("%s: statements (-want +got):\n%s", s.name, diff)
		}
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.refusals > 3 {
		t.Errorf("%d writes of refusals per minute for 3 refusals", tr.refusals)
	}
}

// TestUnknownUsernamesLikeKnown: a known and an unknown username get the
// same responses, field by field, attempt after attempt, through the
// throttle. The one thing that may differ is the Retry-After of a refusal
// (in the header, retryAfter and the detail): each username's window began
// at its own first failure, and a loaded machine may put a second's
// boundary between the two. Each is checked instead against its own window
// on the database clock (read before the request is sent and after it is
// answered), then both are compared without it.
func TestUnknownUsernamesLikeKnown(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 3}).Handler(newApp(t, "alice"))
	ctx := context.Background()
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	// attempt signs user in with a wrong password and returns the answer
	// without its Date, and a refusal without its Retry-After once that is
	// checked against the user's window.
	attempt := func(user string) response {
		t.Helper()
		s := dbNow()
		r := signIn(t, h, user, "wrong")
		e := dbNow()
		r.header = r.header.Clone()
		r.header.Del("Date")
		if r.status != http.StatusTooManyRequests {
			return r
		}
		var end time.Time
		if err := pool.QueryRow(ctx, `SELECT expires_at FROM pglimit.login_attempt WHERE key = $1`, "username:"+user).Scan(&end); err != nil {
			t.Fatal(err)
		}
		retry, _ := r.body["retryAfter"].(float64)
		lo, hi := retryafter.Seconds(end.Sub(e)), retryafter.Seconds(end.Sub(s))
		if int(retry) < lo || int(retry) > hi || r.header.Get("Retry-After") != fmt.Sprint(retry) {
			t.Errorf("%s: retryAfter %v, Retry-After %q, want %d to %d", user, retry, r.header.Get("Retry-After"), lo, hi)
		}
		r.body = maps.Clone(r.body)
		r.body["retryAfter"] = "N"
		if d, ok := r.body["detail"].(string); ok {
			r.body["detail"] = strings.Replace(d, fmt.Sprintf(" %v more seconds", retry), " N more seconds", 1)
		}
		r.header.Set("Retry-After", "N")
		return r
	}
	for i := 0; i < 6; i++ {
		known := attempt("alice")
		unknown := attempt("nobody")
		if diff := cmp.Diff(known, unknown, cmp.AllowUnexported(response{})); diff != "" {
			t.Fatalf("attempt %d: known and unknown usernames answered differently (-known +unknown):\n%s", i+1, diff)
		}
	}
}

// TestFailureSurvivesRollback: the handler does its work in a transaction,
// records the failure through the throttle and rolls its transaction back;
// the failure stays counted (django-axes #611 loses exactly this one). The
// same when the handler only answers 401 after its rollback.
func TestFailureSurvivesRollback(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, `CREATE TABLE audit (what text)`); err != nil {
		t.Fatal(err)
	}
	for _, explicit := range []bool{true, false} {
		t.Run(fmt.Sprintf("explicit=%v", explicit), func(t *testing.T) {
			user := fmt.Sprintf("victim-%v", explicit)
			handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				tx, err := pool.Begin(r.Context())
				if err != nil {
					problem.Internal(w, r)
					return
				}
				defer tx.Rollback(context.Background())
				if _, err := tx.Exec(r.Context(), `INSERT INTO audit VALUES ('sign-in failed')`); err != nil {
					problem.Internal(w, r)
					return
				}
				// The control: the same failure written on the request's
				// transaction is lost with it, which is what the throttle
				// must not do.
				if _, err := db.New().LoginAttemptRecordFailure(r.Context(), tx, &db.LoginAttemptRecordFailureParams{
					Key: "control:" + user, WindowMs: 60000}); err != nil {
					problem.Internal(w, r)
					return
				}
				if explicit {
					p, _ := signin.FromContext(r.Context())
					if err := p.Fail(r.Context()); err != nil {
						problem.Internal(w, r)
						return
					}
				}
				if err := tx.Rollback(r.Context()); err != nil {
					problem.Internal(w, r)
					return
				}
				w.WriteHeader(http.StatusUnauthorized)
			})
			h := newLimiter(t, pool, signin.Options{Lenient: true}).Handler(handler)
			for i := 1; i <= 3; i++ {
				if got := signIn(t, h, user, "wrong"); got.status != http.StatusUnauthorized {
					t.Fatalf("status %d", got.status)
				}
				if n := failures(t, pool, "username:"+user); n != i {
					t.Fatalf("after %d rolled-back failures the throttle counts %d", i, n)
				}
				if n := failures(t, pool, "control:"+user); n != 0 {
					t.Fatalf("the control written in the request's transaction survived its rollback (%d)", n)
				}
			}
		})
	}
	var audited int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM audit`).Scan(&audited); err != nil {
		t.Fatal(err)
	}
	if audited != 0 {
		t.Fatalf("the handler's transaction was not rolled back (%d rows)", audited)
	}
}

// TestDatabaseDownFailsClosed: with the database gone the sign-in is 503
// sign-in-unavailable and no password is checked; a failure that cannot be
// recorded turns the handler's 401 into the same 503. After a restart the
// throttle works again.
func TestDatabaseDownFailsClosed(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	ctx := context.Background()
	pool := pgtest.Pool(t, c.URL("postgres"), 4)
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, "alice")
	a.during = func(r *http.Request, password string) {
		if password == "kill" {
			if err := c.Kill(); err != nil {
				t.Error(err)
			}
		}
	}
	h := newLimiter(t, pool, signin.Options{Lenient: true}).Handler(a)
	if got := signIn(t, h, "alice", "wrong"); got.status != http.StatusUnauthorized {
		t.Fatalf("before the kill: %d", got.status)
	}

	// The database dies while the password is being checked: the failure
	// cannot be counted, so the 401 must not go out.
	got := signIn(t, h, "alice", "kill")
	if got.status != http.StatusServiceUnavailable {
		t.Fatalf("failure not recordable: status %d, want 503; body %v", got.status, got.body)
	}
	if diff := cmp.Diff(wantUnavailable, got.body); diff != "" {
		t.Errorf("503 body (-want +got):\n%s", diff)
	}
	if got.header.Get("Retry-After") == "" {
		t.Error("503 without Retry-After")
	}
	evaluated := a.evaluated.Load()

	// The database is down: nobody gets to try a password, right or wrong.
	for _, pw := range []string{"wrong", rightPassword} {
		got := signIn(t, h, "alice", pw)
		if got.status != http.StatusServiceUnavailable {
			t.Fatalf("database down, password %q: status %d, want 503", pw, got.status)
		}
		if diff := cmp.Diff(wantUnavailable, got.body); diff != "" {
			t.Errorf("503 body (-want +got):\n%s", diff)
		}
	}
	if n := a.evaluated.Load(); n != evaluated {
		t.Fatalf("%d passwords were checked while the throttle's database was down", n-evaluated)
	}

	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	// UNLOGGED tables were emptied by the crash: the count starts again.
	deadline := time.Now().Add(20 * time.Second)
	for {
		got := signIn(t, h, "alice", "wrong")
		if got.status == http.StatusUnauthorized {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: still %d", got.status)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestDatabaseHangsFailsClosed: a database that hangs rather than refuses
// (every process stopped with SIGSTOP; the pool's connections stay open)
// fails the sign-in 503 sign-in-unavailable within the check's bound of a
// few seconds — before, the check waited on its connection for ever — and
// no password is checked; after SIGCONT the throttle works again. In
// normal and strict mode.
func TestDatabaseHangsFailsClosed(t *testing.T) {
	t.Parallel()
	c := pgtest.Cluster(t)
	t.Cleanup(c.Thaw)
	ctx := context.Background()
	pool := pgtest.Pool(t, c.URL("postgres"), 4)
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	a := newApp(t, "alice")
	for _, strict := range []bool{false, true} {
		h := newLimiter(t, pool, signin.Options{Lenient: !strict}).Handler(a)
		if got := signIn(t, h, "alice", "wrong"); got.status != http.StatusUnauthorized {
			t.Fatalf("strict %v, before the freeze: %d", strict, got.status)
		}
		evaluated := a.evaluated.Load()
		if err := c.Freeze(); err != nil {
			t.Fatal(err)
		}
		done := make(chan response, 1)
		start := time.Now()
		go func() { done <- signIn(t, h, "alice", rightPassword) }()
		var got response
		select {
		case got = <-done:
		case <-time.After(30 * time.Second):
			c.Thaw()
			t.Fatalf("strict %v: the sign-in hung on the frozen database for 30 s", strict)
		}
		took := time.Since(start)
		c.Thaw()
		if got.status != http.StatusServiceUnavailable {
			t.Fatalf("strict %v, frozen database: status %d, want 503", strict, got.status)
		}
		if diff := cmp.Diff(wantUnavailable, got.body); diff != "" {
			t.Errorf("503 body (-want +got):\n%s", diff)
		}
		if n := a.evaluated.Load(); n != evaluated {
			t.Errorf("strict %v: a password was checked while the throttle's database hung", strict)
		}
		t.Logf("strict %v: 503 after %v with the database frozen", strict, took.Round(10*time.Millisecond))
		deadline := time.Now().Add(20 * time.Second)
		for signIn(t, h, "alice", "wrong").status != http.StatusUnauthorized {
			if time.Now().After(deadline) {
				t.Fatalf("strict %v: the sign-in did not recover after SIGCONT", strict)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// TestWindowLapses: with a short window the refusal lasts until the window
// ends on the database clock, and not longer. Judged on the database clock
// alone: an observer reads the row's window and the clock before each
// request is sent and after it is answered, so the decision happened
// between the two readings; a refusal read before the window ended at
// its start is due, one read after it ended is a refusal too long, and a
// success is due only if the window had ended by the second reading. How
// slowly a loaded machine runs the requests does not matter; only when
// it is so slow that the window ends before the first refusal (nothing to
// judge) does the test start again with another username.
func TestWindowLapses(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	const window = 1500 * time.Millisecond
	users := []string{"alice", "bob", "carol"}
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 2, Window: window}).Handler(newApp(t, users...))
	ctx := context.Background()
	dbNow := func() time.Time {
		t.Helper()
		var now time.Time
		if err := pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&now); err != nil {
			t.Fatal(err)
		}
		return now
	}
	// retryRange is the Retry-After (seconds) due for a decision between
	// s and e, with the window ending at end.
	retryRange := func(s, e, end time.Time) (lo, hi int) {
		return retryafter.Seconds(end.Sub(e)), retryafter.Seconds(end.Sub(s))
	}
	for _, user := range users {
		signIn(t, h, user, "wrong")
		signIn(t, h, user, "wrong")
		var first, end time.Time
		if err := pool.QueryRow(ctx, `SELECT first_at, expires_at FROM pglimit.login_attempt WHERE key = $1`,
			"username:"+user).Scan(&first, &end); err != nil {
			t.Fatal(err)
		}
		if end.Sub(first) != window {
			t.Fatalf("the window runs from %v to %v, want %v", first, end, window)
		}
		s := dbNow()
		got := signIn(t, h, user, rightPassword)
		e := dbNow()
		if !s.Before(end) {
			t.Logf("%s: the first sign-in after the failures was sent %v after the window ended; again with another username",
				user, s.Sub(end))
			continue
		}
		if got.status != http.StatusTooManyRequests {
			t.Fatalf("status %d, want 429: sent %v before the window ended", got.status, end.Sub(s))
		}
		retry, _ := got.body["retryAfter"].(float64)
		if lo, hi := retryRange(s, e, end); int(retry) < lo || int(retry) > hi {
			t.Errorf("retryAfter %v, want %d to %d: the refusal was decided %v to %v before the window ended",
				retry, lo, hi, end.Sub(e), end.Sub(s))
		}
		if diff := cmp.Diff(wantThrottled(2, int(retry)), got.body); diff != "" {
			t.Errorf("refusal (-want +got):\n%s", diff)
		}
		for {
			s := dbNow()
			got := signIn(t, h, user, rightPassword)
			e := dbNow()
			if got.status == http.StatusOK {
				if e.Before(end) {
					t.Fatalf("throttle lifted %v before the window ended", end.Sub(e))
				}
				return
			}
			if got.status != http.StatusTooManyRequests {
				t.Fatalf("status %d", got.status)
			}
			if !s.Before(end) {
				t.Fatalf("still throttled %v after the window ended", s.Sub(end))
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	t.Fatalf("for each of %v the window ended before the first sign-in after the failures: nothing was judged", users)
}

// burst sends n concurrent wrong passwords for one username through three
// replicas (three pools, three limiters, three servers) and returns the
// statuses seen.
func burst(t *testing.T, strict bool, n, limit int) (a *app, statuses map[int]int, pools []*pgxpool.Pool) {
	t.Helper()
	url := pgtest.URL(t)
	a = newApp(t, "alice")
	a.delay = 20 * time.Millisecond // a real bcrypt cost is slower still
	var servers []*httptest.Server
	for i := 0; i < 3; i++ {
		pool := pgtest.Pool(t, url, 10)
		pools = append(pools, pool)
		// The burst is about checks and records racing, not the time
		// bound: 100 requests on 30 connections of a loaded machine (or of
		// a shared server checkpointing for other tests' DROP DATABASE)
		// may wait longer than the default Timeout for a connection.
		srv := httptest.NewServer(newLimiter(t, pool, signin.Options{Limit: limit, Lenient: !strict, Timeout: time.Minute}).Handler(a))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	t.Cleanup(client.CloseIdleConnections)
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		start = make(chan struct{})
	)
	statuses = map[int]int{}
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			b, _ := json.Marshal(map[string]string{"username": "alice", "password": fmt.Sprint("guess-", i)})
			res, err := client.Post(servers[i%3].URL, "application/json", bytes.NewReader(b))
			code := -1
			if err == nil {
				_, _ = io.Copy(io.Discard, res.Body)
				res.Body.Close()
				code = res.StatusCode
			}
			mu.Lock()
			statuses[code]++
			mu.Unlock()
		}()
	}
	close(start)
	wg.Wait()
	return a, statuses, pools
}

// TestConcurrentAttemptsNormalMode measures the documented weakness of the
// read-then-write cost model: 100 concurrent wrong passwords for one
// username through three replicas get more than the limit evaluated,
// because they all read the count before any failure is written. Every
// evaluated failure is still counted (none lost).
func TestConcurrentAttemptsNormalMode(t *testing.T) {
	t.Parallel()
	const limit = 5
	a, statuses, pools := burst(t, false, 100, limit)
	evaluated := a.evaluated.Load()
	t.Logf("normal mode: %d of 100 concurrent wrong passwords were evaluated (limit %d); statuses %v", evaluated, limit, statuses)
	if statuses[401]+statuses[429] != 100 {
		t.Fatalf("statuses %v: want only 401 and 429", statuses)
	}
	if evaluated <= limit {
		t.Fatalf("only %d evaluated: the race the documentation describes did not show", evaluated)
	}
	if n := failures(t, pools[0], "username:alice"); int64(n) != evaluated {
		t.Fatalf("the table counts %d failures for %d evaluated", n, evaluated)
	}
}

// TestConcurrentAttemptsStrictMode: the same burst in strict mode
// evaluates exactly the limit, and refuses the rest with the full body.
func TestConcurrentAttemptsStrictMode(t *testing.T) {
	t.Parallel()
	const limit = 5
	a, statuses, pools := burst(t, true, 100, limit)
	t.Logf("strict mode: %d of 100 concurrent wrong passwords were evaluated (limit %d); statuses %v", a.evaluated.Load(), limit, statuses)
	if n := a.evaluated.Load(); n != limit {
		t.Fatalf("%d passwords evaluated, want exactly %d", n, limit)
	}
	if diff := cmp.Diff(map[int]int{401: limit, 429: 100 - limit}, statuses); diff != "" {
		t.Fatalf("statuses (-want +got):\n%s", diff)
	}
	if n := failures(t, pools[0], "username:alice"); n != limit {
		t.Fatalf("the table counts %d failures, want %d", n, limit)
	}
}

// TestStrictModeGivesBackNonAttempts: in strict mode a request that turns
// out not to be an attempt (a 400, a 500, a panic, nothing written) gives
// its reservation back; a 401 keeps it.
func TestStrictModeGivesBackNonAttempts(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	var mode atomic.Value
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch mode.Load().(string) {
		case "400":
			respond.BadRequest(w, "invalid-request", "Invalid request", "No password.")
		case "500":
			w.WriteHeader(http.StatusInternalServerError)
		case "panic":
			panic(http.ErrAbortHandler)
		case "nothing":
		case "explicit":
			p, _ := signin.FromContext(r.Context())
			_ = p.Release(r.Context())
			w.WriteHeader(http.StatusUnauthorized) // the explicit report wins
		case "401":
			w.WriteHeader(http.StatusUnauthorized)
		}
	})
	h := newLimiter(t, pool, signin.Options{Limit: 3, Lenient: false}).Handler(handler)
	for _, m := range []string{"400", "500", "panic", "nothing", "explicit"} {
		mode.Store(m)
		func() {
			defer func() {
				if p := recover(); p != nil && p != http.ErrAbortHandler {
					t.Fatal(p)
				}
			}()
			signIn(t, h, "alice", "x")
		}()
		if n := failures(t, pool, "username:alice"); n != 0 {
			t.Fatalf("%s: %d failures counted, want the reservation given back", m, n)
		}
	}
	mode.Store("401")
	signIn(t, h, "alice", "x")
	if n := failures(t, pool, "username:alice"); n != 1 {
		t.Fatalf("401: %d failures, want 1", n)
	}
}

// TestBadInput: requests without a usable username are refused 400
// invalid-sign-in-request by the throttle and never reach the handler (a
// password it cannot count is never checked); a body too large never
// reaches it either; nothing fails with a 500; a JSON body is read as JSON
// whatever its Content-Type; odd but valid usernames are throttled like any
// other.
func TestBadInput(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	var reached, unidentified atomic.Int64
	h := newLimiter(t, pool, signin.Options{Lenient: true, MaxBodyBytes: 16 << 10}).Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		if _, ok := signin.FromContext(r.Context()); !ok {
			unidentified.Add(1)
			t.Error("a request reached the handler without a Permit")
		}
		body, _ := io.ReadAll(r.Body)
		if len(body) == 0 {
			t.Error("the handler got an empty body")
		}
		w.WriteHeader(http.StatusUnauthorized)
	}))
	noUsername := map[string]any{
		"type": "urn:pglimit:problem:invalid-sign-in-request", "title": "Invalid sign-in request", "status": float64(400),
		"detail": `The sign-in request must carry a username: a JSON object or a form with the field "username".`,
	}
	tooLarge := map[string]any{
		"type": "urn:pglimit:problem:sign-in-request-too-large", "title": "Sign-in request too large", "status": float64(413),
		"detail": "The sign-in request body is too large.",
	}
	for _, tc := range []struct {
		name, contentType, body string
		status                  int
		want                    map[string]any
	}{
		{"empty body", "application/json", "", 400, noUsername},
		{"not json", "application/json", "{username:", 400, noUsername},
		{"json array", "application/json", `["alice"]`, 400, noUsername},
		{"trailing object", "application/json", `{"username":"alice"}{"username":"alice"}`, 400, noUsername},
		{"trailing garbage", "application/json", `{"username":"alice"} x`, 400, noUsername},
		{"trailing data sent as a form (curl -d)", "application/x-www-form-urlencoded", `{"username":"alice"},1`, 400, noUsername},
		{"no username", "application/json", `{"password":"x"}`, 400, noUsername},
		{"username a number", "application/json", `{"username":42}`, 400, noUsername},
		{"empty username", "application/json", `{"username":""}`, 400, noUsername},
		{"blank username", "application/json", `{"username":" \t "}`, 400, noUsername},
		{"null username", "application/json", `{"username":null}`, 400, noUsername},
		{"unknown content type", "text/plain", `username=alice`, 400, noUsername},
		{"bad form", "application/x-www-form-urlencoded", `username=%zz`, 400, noUsername},
		{"too large", "application/json", `{"username":"alice","password":"` + strings.Repeat("x", 20<<10) + `"}`, 413, tooLarge},
		{"NUL in username", "application/json", `{"username":"al\u0000ice"}`, 401, nil},
		{"invalid UTF-8 in a form", "application/x-www-form-urlencoded", "username=%ff%fe", 401, nil},
		{"very long username", "application/json", `{"username":"` + strings.Repeat("é", 5000) + `"}`, 401, nil},
		{"form", "application/x-www-form-urlencoded", "username=Bob&password=x", 401, nil},
		{"json without content type", "", `{"username":"bob"}`, 401, nil},
		{"json with trailing white space", "application/json", "{\"username\":\"dave\"}\n\t ", 401, nil},
		{"form without content type", "", `username=bob`, 401, nil},
		{"json+problem type", "application/vnd.api+json; charset=utf-8", `{"username":"bob"}`, 401, nil},
		{"json sent as text/plain", "text/plain", `{"username":"bob"}`, 401, nil},
		{"json sent as a form (curl -d)", "application/x-www-form-urlencoded", ` {"username":"carol","password":"x"}`, 401, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before, beforeUnidentified := reached.Load(), unidentified.Load()
			req := httptest.NewRequest(http.MethodPost, "/api/session", strings.NewReader(tc.body))
			if tc.contentType != "" {
				req.Header.Set("Content-Type", tc.contentType)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			got := decode(t, rec.Result())
			if got.status != tc.status {
				t.Fatalf("status %d, want %d; body %v", got.status, tc.status, got.body)
			}
			if tc.want != nil {
				if diff := cmp.Diff(tc.want, got.body); diff != "" {
					t.Errorf("body (-want +got):\n%s", diff)
				}
			}
			switch {
			case tc.status == http.StatusRequestEntityTooLarge && reached.Load() != before:
				t.Error("the handler ran for a body too large")
			case tc.status == http.StatusBadRequest && reached.Load() != before:
				t.Error("the handler ran for a request the throttle could not identify")
			case tc.status == http.StatusUnauthorized && (reached.Load() != before+1 || unidentified.Load() != beforeUnidentified):
				t.Error("a request with a username did not reach the handler with a Permit")
			}
		})
	}
	// Form and JSON spellings of bob count together; the unidentified
	// requests counted against nobody.
	if n := failures(t, pool, "username:bob"); n != 5 {
		t.Errorf("bob: %d failures, want 5", n)
	}
	if n := failures(t, pool, "username:carol"); n != 1 {
		t.Errorf("carol: %d failures, want 1", n)
	}
	if n := failures(t, pool, "username:alice"); n != 0 {
		t.Errorf("alice: %d failures from requests the throttle could not identify, want 0", n)
	}
}

// TestStoredKey: keys PostgreSQL text cannot hold, or too long, are hashed.
func TestStoredKey(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		hashed bool
	}{
		{"username:alice", false},
		{strings.Repeat("a", 200), false},
		{strings.Repeat("a", 201), true},
		{"a\x00b", true},
		{"\xff", true},
	} {
		got := signin.StoredKey(tc.in)
		if hashed := strings.HasPrefix(got, "sha256:") && got != tc.in; hashed != tc.hashed {
			t.Errorf("StoredKey(%q) = %q, hashed %v, want %v", tc.in, got, hashed, tc.hashed)
		}
	}
	if signin.StoredKey("a\x00b") == signin.StoredKey("a\x00c") {
		t.Error("two keys hash alike")
	}
}

// TestNonHTTPAPI: Acquire, Fail, Succeed and Release for callers that are
// not HTTP handlers.
func TestNonHTTPAPI(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	ctx := context.Background()
	for _, strict := range []bool{false, true} {
		t.Run(fmt.Sprintf("strict=%v", strict), func(t *testing.T) {
			key := fmt.Sprintf("cli:%v", strict)
			l := newLimiter(t, pool, signin.Options{Limit: 2, Lenient: !strict})
			for i := 0; i < 2; i++ {
				a, err := l.Acquire(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				if err := a.Fail(ctx); err != nil {
					t.Fatal(err)
				}
			}
			_, err := l.Acquire(ctx, key)
			var le *limit.Refusal
			if !errors.Is(err, pglimit.ErrLimited) || !errors.As(err, &le) {
				t.Fatalf("third check: %v, want a *limit.Refusal", err)
			}
			if le.Limit != 2 || le.Window != 15*time.Minute || le.Kind != "signin" || le.Scope != "username" || le.RetryAfter <= 14*time.Minute || le.RetryAfter > 15*time.Minute {
				t.Fatalf("refusal %+v", le)
			}
			if _, err := l.Acquire(ctx, ""); !errors.Is(err, signin.ErrNoKey) {
				t.Fatalf("empty key: %v", err)
			}
			if _, err := pool.Exec(ctx, `DELETE FROM pglimit.login_attempt WHERE key = $1`, key); err != nil {
				t.Fatal(err)
			}
			a, err := l.Acquire(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Succeed(ctx); err != nil {
				t.Fatal(err)
			}
			if err := a.Fail(ctx); err != nil { // after the outcome: ignored
				t.Fatal(err)
			}
			if n := failures(t, pool, key); n != 0 {
				t.Fatalf("%d failures after a success", n)
			}
		})
	}
	if p, ok := signin.FromContext(ctx); ok || p.Fail(ctx) != nil || p.Succeed(ctx) != nil || p.Release(ctx) != nil {
		t.Fatalf("a context without an attempt: FromContext %v, %v; a nil Permit's methods must do nothing", p, ok)
	}
}

// TestBadOptions are refused by New, each with an error naming what is
// wrong; the defaults of a good set are applied.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	for _, tc := range []struct {
		name string
		opts signin.Options
		want string
	}{
		{"negative limit", signin.Options{Limit: -1}, "Limit"},
		{"limit above MaxLimit", signin.Options{Limit: pglimit.MaxLimit + 1}, "Limit"},
		{"negative window", signin.Options{Window: -time.Second}, "Window"},
		{"tiny window", signin.Options{Window: time.Microsecond}, "Window"},
		{"window without bound", signin.Options{Window: math.MaxInt64}, "Window"},
		{"negative body", signin.Options{MaxBodyBytes: -1}, "MaxBodyBytes"},
		{"negative timeout", signin.Options{Timeout: -time.Second}, "Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := signin.New(pool, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if _, err := signin.New(nil, signin.Options{}); err == nil {
		t.Error("New accepted a nil pool")
	}
	l := newLimiter(t, pool, signin.Options{})
	if l.Limit() != 5 || l.Window() != 15*time.Minute || !l.Strict() || l.Name() != "sign-in" {
		t.Errorf("defaults: %d %v %v %q", l.Limit(), l.Window(), l.Strict(), l.Name())
	}
	if _, err := signin.New(pool, signin.Options{Limit: pglimit.MaxLimit}); err != nil {
		t.Errorf("New at MaxLimit: %v", err)
	}
}

// TestOnErrorWritesEveryResponse: a throttled key, a body too large, a
// database that cannot be reached and a failure that cannot be recorded
// all go through OnError.
func TestOnErrorWritesEveryResponse(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewDB(t, 2)
	var got []error
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		got = append(got, err)
		w.WriteHeader(http.StatusTeapot)
	}
	quiet := slog.New(slog.DiscardHandler)
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 1, MaxBodyBytes: 1 << 10, OnError: onError, Logger: quiet}).Handler(newApp(t, "alice"))
	signIn(t, h, "alice", "wrong")
	if res := signIn(t, h, "alice", "wrong"); res.status != http.StatusTeapot || len(got) != 1 || !errors.Is(got[0], pglimit.ErrLimited) {
		t.Fatalf("throttled: %d, OnError got %v", res.status, got)
	}
	if res := signIn(t, h, "bob", strings.Repeat("x", 2<<10)); res.status != http.StatusTeapot || len(got) != 2 {
		t.Fatalf("too large: %d, OnError got %v", res.status, got)
	}
	var tooLarge *http.MaxBytesError
	if !errors.As(got[1], &tooLarge) {
		t.Errorf("too large: OnError got %v, want a *http.MaxBytesError", got[1])
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	down := newLimiter(t, closed, signin.Options{Lenient: true, OnError: onError, Logger: quiet}).Handler(newApp(t, "alice"))
	if res := signIn(t, down, "alice", "wrong"); res.status != http.StatusTeapot || len(got) != 3 || pglimit.Classify(got[2]) != pglimit.ClassUnavailable {
		t.Fatalf("database closed: %d, OnError got %v", res.status, got)
	}
	// The check passes; the failure cannot be written (the table is gone
	// by the time the handler answers).
	a := newApp(t, "carol")
	a.during = func(r *http.Request, _ string) {
		if _, err := pool.Exec(context.Background(), `ALTER TABLE pglimit.login_attempt RENAME TO login_attempt_gone`); err != nil {
			t.Error(err)
		}
	}
	defer pool.Exec(context.Background(), `ALTER TABLE pglimit.login_attempt_gone RENAME TO login_attempt`)
	h = newLimiter(t, pool, signin.Options{Lenient: true, OnError: onError, Logger: quiet}).Handler(a)
	if res := signIn(t, h, "carol", "wrong"); res.status != http.StatusTeapot || len(got) != 4 || !errors.Is(got[3], signin.ErrNotRecorded) {
		t.Fatalf("failure not recorded: %d, OnError got %v", res.status, got)
	}
	rec := httptest.NewRecorder()
	signin.WriteError(rec, httptest.NewRequest(http.MethodPost, "/api/session", nil), got[3])
	if diff := cmp.Diff(wantUnavailable, decode(t, rec.Result()).body); diff != "" || rec.Code != http.StatusServiceUnavailable {
		t.Errorf("WriteError of an unrecorded failure: %d (-want +got):\n%s", rec.Code, diff)
	}
}

// TestForwardedForIsIgnored: the default key never trusts X-Forwarded-For
// (or any header): an attacker rotating it still hits the username's limit.
func TestForwardedForIsIgnored(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	h := newLimiter(t, pool, signin.Options{Lenient: true, Limit: 3}).Handler(newApp(t, "alice"))
	var last response
	for i := 0; i < 4; i++ {
		req := httptest.NewRequest(http.MethodPost, "/api/session", strings.NewReader(`{"username":"alice","password":"x"}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Forwarded-For", fmt.Sprintf("203.0.113.%d", i))
		req.Header.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", i))
		req.RemoteAddr = fmt.Sprintf("192.0.2.%d:1234", i)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		last = decode(t, rec.Result())
	}
	checkThrottled(t, last, 3, 15*time.Minute)
}
