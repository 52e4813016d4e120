package main_test

// Tests of issue 27: what one console user (bob, an account and nothing
// more) can do to the others through POST /api/sql.

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// TestConsoleSlowReaderHoldsNoDatabase (issue 27, 1): bob's statement takes
// the advisory lock every installation permit claim waits on, and his client
// (a 4 kB receive buffer) never reads the answer. The console has closed its
// connection before the answer's first byte, so while the answer is still
// unread bob's backend is gone from pg_stat_activity and the lock is free,
// and carol's heavy requests are answered 200 as promptly as before the
// attack (judged against her own baseline, measured first). The answer
// stalls and its write deadline ends it: bob's permit (cap 1) comes back.
func TestConsoleSlowReaderHoldsNoDatabase(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-sql-console-cap", "1", "-token-in-flight", "100")
	base := procs[0].URL
	obs := pgtest.Pool(t, dbURL, 1)
	ctx := context.Background()

	// carol's heavy requests: a history page and a console statement.
	heavyRound := func(ctx context.Context) (time.Duration, error) {
		start := time.Now()
		for _, c := range []struct {
			method, path string
			body         any
		}{
			{http.MethodGet, "/api/events?size=10", nil},
			{http.MethodPost, "/api/sql", console("SELECT count(*) FROM event")},
		} {
			r, err := send(ctx, c.method, base+c.path, "carol-token", c.body)
			if err != nil {
				return 0, fmt.Errorf("%s: %w", c.path, err)
			}
			if r.Status != http.StatusOK {
				return 0, fmt.Errorf("%s: %d %s", c.path, r.Status, r.Body)
			}
		}
		return time.Since(start), nil
	}
	var baseline time.Duration
	for range 3 {
		d, err := heavyRound(ctx)
		if err != nil {
			t.Fatal(err)
		}
		baseline = max(baseline, d)
	}
	allowed := 10*baseline + 2*time.Second

	const marker = "slow-reader-27"
	body, _ := json.Marshal(console("SELECT pg_advisory_lock(1196, hashtext('heavy_permit:installation')), repeat('<', 60000), '" +
		marker + "' FROM generate_series(1, 100)"))
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/api/sql", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer bob-token")
	req.Header.Set("Content-Type", "application/json")
	resp, err := smallBufferClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("bob's statement: %d %s", resp.StatusCode, b)
	}
	// The answer has begun and is not read: the console's connection, its
	// backend and its session lock are gone already.
	wait.For(t, 10*time.Second, "bob's console backend and advisory lock gone while his answer is unread", func() bool {
		return count(obs, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND pid <> pg_backend_pid() AND strpos(query, $1) > 0`, marker) == 0 &&
			count(obs, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1196 AND objsubid = 2
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`) == 0
	})
	for range 3 {
		rctx, cancel := context.WithTimeout(ctx, 3*allowed)
		d, err := heavyRound(rctx)
		cancel()
		if err != nil {
			t.Fatalf("carol's heavy requests while bob's answer is unread: %v (baseline %v)", err, baseline)
		}
		t.Logf("carol's heavy requests: %v (baseline %v, allowed %v)", d, baseline, allowed)
		if d > allowed {
			t.Errorf("carol's heavy requests took %v while bob's answer is unread; baseline %v", d, baseline)
		}
	}
	// The stalled answer meets its write deadline; the handler returns and
	// bob's only permit is released.
	took := wait.For(t, 2*time.Minute, "bob's permit released by the stalled answer's write deadline", func() bool {
		r, err := send(ctx, http.MethodPost, base+"/api/sql", "bob-token", console("SELECT 1"))
		return err == nil && r.Status == http.StatusOK
	})
	t.Logf("bob's permit came back after %v", took)
	got, _ := io.ReadAll(resp.Body)
	if json.Valid(got) {
		t.Errorf("the stalled answer arrived whole (%d bytes) although its client never read", len(got))
	}
}

// TestConsoleUsersAreApart (issue 27, 3): alice's console statement runs;
// bob, through another replica, can neither read its text in
// pg_stat_activity nor cancel or terminate it, because each console user
// logs in as a role of their own. Both as a superuser service and as a
// service whose role only has CREATEROLE, two replicas each.
func TestConsoleUsersAreApart(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 1)
	ctx := context.Background()
	for _, stmt := range []string{
		`CREATE DATABASE su`,
		`CREATE ROLE service LOGIN CREATEROLE`,
		`CREATE DATABASE cr OWNER service`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct{ name, db, user string }{
		{"superuser", "su", "postgres"},
		{"createrole", "cr", "service"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := strings.Replace(cluster.URL(tc.db), "postgres@", tc.user+"@", 1)
			procs := studioOn(t, url, 2)
			obs := pgtest.Pool(t, cluster.URL(tc.db), 1)
			sessionUser := func(p int, token string) string {
				rows := call(t, http.MethodPost, procs[p].URL+"/api/sql", token, console("SELECT session_user::text")).rows(t)
				return fmt.Sprint(rows)
			}
			if a, b := sessionUser(0, "alice-token"), sessionUser(1, "bob-token"); a == b {
				t.Errorf("alice and bob log in as the same role %s", a)
			}

			secret := "alice-secret-" + tc.name
			alice := make(chan *response, 1)
			go func() {
				r, _ := send(ctx, http.MethodPost, procs[0].URL+"/api/sql", "alice-token", console("SELECT pg_sleep(60), '"+secret+"'"))
				alice <- r
			}()
			var pid int
			wait.For(t, 30*time.Second, "alice's statement running", func() bool {
				return obs.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE state = 'active' AND pid <> pg_backend_pid()
					AND strpos(query, $1) > 0`, secret).Scan(&pid) == nil
			})
			bobSQL := func(sql string) *response {
				return call(t, http.MethodPost, procs[1].URL+"/api/sql", "bob-token", console(sql))
			}
			r := bobSQL(fmt.Sprintf(`SELECT pid, query FROM pg_stat_activity WHERE pid = %d`, pid))
			if strings.Contains(string(r.Body), secret) {
				t.Errorf("bob read alice's statement: %s", r.Body)
			}
			r = bobSQL(`SELECT count(*) FROM pg_stat_activity WHERE strpos(query, 'alice' || '-secret') > 0`)
			if rows := r.rows(t); fmt.Sprint(rows) != "[[0]]" {
				t.Errorf("bob sees %v statements of alice's", rows)
			}
			for _, fn := range []string{"pg_cancel_backend", "pg_terminate_backend"} {
				r := bobSQL(fmt.Sprintf(`SELECT %s(%d)`, fn, pid))
				if r.Status == http.StatusOK {
					t.Errorf("bob's %s of alice's statement: %s", fn, r.Body)
					continue
				}
				if m := r.problemOf(t, http.StatusBadRequest, "invalid-sql"); m["sqlstate"] != "42501" {
					t.Errorf("bob's %s: %v, want permission denied (42501)", fn, m)
				}
			}
			if n := count(obs, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1 AND state = 'active'`, pid); n != 1 {
				t.Errorf("alice's statement no longer runs after bob's tries (%d)", n)
			}
			// The test ends alice's statement itself, in its own cluster.
			if _, err := obs.Exec(ctx, `SELECT pg_cancel_backend($1)`, pid); err != nil {
				t.Fatal(err)
			}
			<-alice
		})
	}
}

// TestConsoleMemoryIsBounded (issue 27, 4): a statement whose one value is
// an array of 20 million integers (160 MB on the wire, several times that
// decoded) does not grow the replica's peak resident memory by more than
// the console's own bounds, and a result of '<' characters, which JSON
// writes as six bytes each, stops with bound ROWS within the 8 MB cap of
// the bytes actually sent.
func TestConsoleMemoryIsBounded(t *testing.T) {
	t.Parallel()
	const responseCap = 8 << 20
	procs, _ := studio(t, 1, "-sql-console-rows", "1000")
	p := procs[0]
	url := p.URL + "/api/sql"
	call(t, http.MethodPost, url, "alice-token", console("SELECT 1")).rows(t)

	// The peak resident set is reset (clear_refs 5), then read after the
	// statement.
	status := fmt.Sprintf("/proc/%d/status", p.PID())
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", p.PID()), []byte("5"), 0); err != nil {
		t.Logf("peak RSS not reset (%v): measured from the replica's start", err)
	}
	before := procKB(t, status, "VmHWM")
	r := call(t, http.MethodPost, url, "alice-token", console("SELECT array_fill(0, ARRAY[20000000])"))
	after := procKB(t, status, "VmHWM")
	t.Logf("peak RSS %d kB before, %d kB after the array; answer %d %.200s", before, after, r.Status, r.Body)
	if grew := (after - before) << 10; grew > 128<<20 {
		t.Errorf("the array grew the replica's peak RSS by %d MB; want at most 128 MB", grew>>20)
	}
	if r.Status != http.StatusOK || len(r.Body) > responseCap {
		t.Errorf("the array's answer: %d, %d bytes", r.Status, len(r.Body))
	}

	r = call(t, http.MethodPost, url, "alice-token", console("SELECT repeat('<', 60000) FROM generate_series(1, 1000)"))
	if len(r.Body) > responseCap {
		t.Errorf("the answer is %d bytes; the cap is %d", len(r.Body), responseCap)
	}
	rows := r.rows(t)
	if bound := r.json(t)["bound"]; bound != "ROWS" || len(rows) == 0 {
		t.Errorf("answer of %d bytes: bound %v, %d rows; want ROWS and some rows", len(r.Body), bound, len(rows))
	}
	if !bytes.HasSuffix(bytes.TrimSpace(r.Body), []byte(`"bound":"ROWS"}`)) {
		t.Errorf("the answer does not end with its bound: %q", r.Body[max(0, len(r.Body)-40):])
	}
}

// procKB reads a "Name:  N kB" line of a /proc status file.
func procKB(t *testing.T, path, name string) int64 {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("%s: no %s", path, name)
	return 0
}
