package pglimit_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
)

// TestDedicatedLimitsDatabase runs docs/scaling.md's lines for a limits
// database of its own: pglimit migrated, run and limiting on one pool
// while the service's data and its heavy reads are on another. Observed on
// both databases: the permits, the in-flight slots, the sign-in throttle
// and the replica registry are rows of the limits database while a request
// holds them; the heavy read answers from the service's database; the
// service's database never gets a pglimit schema. The installation cap,
// set from the service's pool as the doc says, lets two heavy requests
// run at once where the limits pool's default would let one.
func TestDedicatedLimitsDatabase(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	app := pgtest.Pool(t, pgtest.EmptyURL(t), 8)    // the service's data
	limits := pgtest.Pool(t, pgtest.EmptyURL(t), 4) // pglimit's tables, on a database of their own
	if _, err := app.Exec(ctx, "CREATE TABLE report_row (id int); INSERT INTO report_row SELECT generate_series(1, 100)"); err != nil {
		t.Fatal(err)
	}

	if err := pglimit.Migrate(ctx, limits); err != nil {
		t.Fatal(err)
	}
	runCtx, stopRun := context.WithCancel(ctx)
	ran := make(chan error, 1)
	go func() { ran <- pglimit.Run(runCtx, limits, pglimit.RunOptions{Replica: "dedicated-1"}) }()
	defer func() {
		stopRun()
		if err := <-ran; err != nil {
			t.Errorf("pglimit.Run: %v", err)
		}
	}()

	userOf := func(r *http.Request) (string, bool) { u := r.Header.Get("X-User"); return u, u != "" }
	reports, err := heavy.New(limits, heavy.Options{Name: "reports", Key: userOf, Limit: 1,
		InstallationLimit: max(1, int(app.Config().MaxConns)/4)}) // the cap guards app's connections
	if err != nil {
		t.Fatal(err)
	}
	throttle, err := signin.New(limits, signin.Options{Lenient: true, Limit: 3})
	if err != nil {
		t.Fatal(err)
	}
	capper, err := inflight.New(limits, inflight.Options{Key: userOf, Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	// (Left to its default, the installation cap would be a quarter of the
	// limits pool, not of the pool the heavy reads run on: heavy's own
	// tests pin the default.)

	inside := make(chan string, 2) // a report request is holding its permits
	proceed := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("GET /report", reports.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		err := heavy.Read(r.Context(), app, func(tx pgx.Tx) error {
			return tx.QueryRow(r.Context(), "SELECT count(*) FROM report_row").Scan(&n)
		})
		if err != nil {
			heavy.WriteError(w, r, err)
			return
		}
		inside <- r.Header.Get("X-User")
		<-proceed
		fmt.Fprint(w, n)
	})))
	mux.Handle("POST /login", throttle.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "wrong password", http.StatusUnauthorized)
	})))
	srv := httptest.NewServer(capper.Handler(mux))
	defer srv.Close()

	get := func(user string) <-chan string {
		out := make(chan string, 1)
		go func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/report", nil)
			req.Header.Set("X-User", user)
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				out <- err.Error()
				return
			}
			defer res.Body.Close()
			var b strings.Builder
			_, _ = fmt.Fprint(&b, res.StatusCode, " ")
			buf := make([]byte, 512)
			n, _ := res.Body.Read(buf)
			b.Write(buf[:n])
			out <- b.String()
		}()
		return out
	}
	alice, bob := get("alice"), get("bob")
	for range 2 {
		select {
		case <-inside:
		case a := <-alice:
			t.Fatalf("alice's report answered before both ran at once: %s", a)
		case b := <-bob:
			t.Fatalf("bob's report answered before both ran at once: %s", b)
		case <-ctx.Done():
			t.Fatal("the two reports never ran at once")
		}
	}
	count := func(pool interface {
		QueryRow(context.Context, string, ...any) pgx.Row
	}, sql string) int {
		t.Helper()
		var n int
		if err := pool.QueryRow(ctx, sql).Scan(&n); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return n
	}
	// Two reports hold a user permit and an installation permit each, and
	// an in-flight slot each: all of them rows of the limits database.
	if got := count(limits, "SELECT count(*) FROM pglimit.heavy_permit WHERE expires_at > now()"); got != 4 {
		t.Errorf("limits database: %d live heavy permits while two reports run, want 4", got)
	}
	if got := count(limits, "SELECT count(*) FROM pglimit.request_in_flight WHERE expires_at > now()"); got != 2 {
		t.Errorf("limits database: %d in-flight slots while two reports run, want 2", got)
	}
	close(proceed)
	for name, ch := range map[string]<-chan string{"alice": alice, "bob": bob} {
		if got := <-ch; got != "200 100" {
			t.Errorf("%s's report: %q, want 200 and the 100 rows of the service's database", name, got)
		}
	}
	if got := count(limits, "SELECT count(*) FROM pglimit.heavy_permit"); got != 0 {
		t.Errorf("limits database: %d heavy permits after the reports, want 0", got)
	}

	// A failed sign-in is counted in the limits database.
	res, err := http.Post(srv.URL+"/login", "application/json", strings.NewReader(`{"username":"carol","password":"x"}`))
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusUnauthorized {
		t.Errorf("sign-in: %d, want 401", res.StatusCode)
	}
	if got := count(limits, "SELECT coalesce(sum(failures), 0)::int FROM pglimit.login_attempt"); got != 1 {
		t.Errorf("limits database: %d failed sign-ins counted, want 1", got)
	}
	// The replica registry is there too (Run's first heartbeat is at once).
	deadline := time.Now().Add(10 * time.Second)
	for count(limits, "SELECT count(*) FROM pglimit.replica WHERE name = 'dedicated-1'") != 1 {
		if time.Now().After(deadline) {
			t.Fatal("limits database: no replica row for dedicated-1")
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And the service's database has none of it.
	if got := count(app, "SELECT count(*) FROM pg_namespace WHERE nspname = 'pglimit'"); got != 0 {
		t.Errorf("the service's database has a pglimit schema")
	}
}
