package main_test

// Tests of issue 42, point 5: the SQL console's resources (temporary
// files, memory, parallel workers), its roles' names, and the statements
// PostgreSQL's protocol cannot carry.

import (
	"context"
	"crypto/md5"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// TestConsoleResources: console statements run with work_mem at
// -sql-console-work-mem and no parallel workers whatever the service's
// role, and with temp_file_limit at -sql-console-temp-file-limit where
// the service's role may set it (a superuser, or a CREATEROLE role granted
// SET ON PARAMETER temp_file_limit); where it may not (CREATEROLE only),
// the log says so at start-up and GET /api/limits says so in its member
// console. Judged by what a console session reads of its settings and by
// pg_db_role_setting of the user's role, read by the test's own
// superuser. On the superuser service, four sorts of a million rows at
// once (each writes about 100 MB of temporary files without a limit)
// write at most 4 × the 8 MB limit in all, by pg_stat_database's
// temp_bytes of the service's database, and each is answered 400
// invalid-sql with SQLSTATE 53400; on the CREATEROLE-only service the same
// four write more than that, and are answered 200.
func TestConsoleResources(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 2)
	ctx := context.Background()
	var version int
	if err := admin.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&version); err != nil {
		t.Fatal(err)
	}
	for _, stmt := range []string{
		`CREATE DATABASE su`,
		`CREATE ROLE service LOGIN CREATEROLE`,
		`CREATE DATABASE cr OWNER service`,
		`CREATE ROLE granted LOGIN CREATEROLE`,
		`CREATE DATABASE gr OWNER granted`,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	const (
		tempLimit = 8 << 20
		statement = "SELECT g FROM generate_series(1, 1000000) g ORDER BY md5(g::text) /* temp-42 */"
	)
	flags := []string{"-sql-console-temp-file-limit", "8MB", "-sql-console-work-mem", "1MB"}
	for _, tc := range []struct {
		name, db, user string
		temp           bool // the console's temp_file_limit is in force
		sorts          bool // run the four sorts
	}{
		{"superuser", "su", "postgres", true, true},
		{"createrole", "cr", "service", false, true},
		{"granted", "gr", "granted", true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "granted" {
				if version < 150000 {
					t.Skipf("GRANT SET ON PARAMETER needs PostgreSQL 15 (server %d)", version)
				}
				if _, err := admin.Exec(ctx, `GRANT SET ON PARAMETER temp_file_limit TO granted`); err != nil {
					t.Fatal(err)
				}
			}
			url := strings.Replace(cluster.URL(tc.db), "postgres@", tc.user+"@", 1)
			p := studioOn(t, url, 1, flags...)[0]
			obs := pgtest.Pool(t, cluster.URL(tc.db), 2)

			// What a console session of alice's runs with, and what her
			// role has as its settings.
			rows := call(t, http.MethodPost, p.URL+"/api/sql", "alice-token", console(`SELECT session_user::text,
				current_setting('temp_file_limit'), current_setting('work_mem'), current_setting('max_parallel_workers_per_gather')`)).rows(t)
			row := as[[]any](t, rows[0], "settings row")
			wantTemp := "-1"
			if tc.temp {
				wantTemp = "8MB"
			}
			if row[1] != wantTemp || row[2] != "1MB" || row[3] != "0" {
				t.Errorf("a console session runs with temp_file_limit, work_mem, max_parallel_workers_per_gather = %v; want %s 1MB 0", row[1:], wantTemp)
			}
			var settings []string
			if err := obs.QueryRow(ctx, `SELECT coalesce((SELECT setconfig FROM pg_db_role_setting s JOIN pg_roles r ON r.oid = s.setrole
				WHERE r.rolname = $1 AND s.setdatabase = 0), '{}')`, row[0]).Scan(&settings); err != nil {
				t.Fatal(err)
			}
			want := []string{"work_mem=1MB", "max_parallel_workers_per_gather=0"}
			if tc.temp {
				want = append(want, "temp_file_limit=8MB")
			}
			for _, w := range want {
				if !contains(settings, w) {
					t.Errorf("alice's role %v has the settings %v; want %s among them", row[0], settings, w)
				}
			}
			if !tc.temp && strings.Contains(strings.Join(settings, " "), "temp_file_limit") {
				t.Errorf("alice's role %v has the settings %v, with a temp_file_limit the service may not set", row[0], settings)
			}

			// The operator's view, and the start-up log.
			m := call(t, http.MethodGet, p.URL+"/api/limits", "alice-token", nil).json(t)
			c := as[map[string]any](t, m["console"], "/api/limits console")
			if c["tempFileLimit"] != wantTemp || c["workMem"] != "1MB" || c["parallelWorkers"] != float64(0) {
				t.Errorf("/api/limits console: %v; want tempFileLimit %s, workMem 1MB, parallelWorkers 0", c, wantTemp)
			}
			log := p.Tail(1 << 20)
			if tc.temp {
				if c["lost"] != nil {
					t.Errorf("/api/limits console lost: %v; want null", c["lost"])
				}
			} else {
				lost, _ := c["lost"].(string)
				for _, s := range []string{"temp_file_limit -1, not 8MB", "GRANT SET ON PARAMETER temp_file_limit"} {
					if !strings.Contains(lost, s) {
						t.Errorf("/api/limits console lost %q does not say %q", lost, s)
					}
				}
				if !strings.Contains(log, "runs without some of its resource settings") || !strings.Contains(log, "temp_file_limit -1, not 8MB") {
					t.Errorf("no start-up log line says the console runs without its temp_file_limit:\n%s", log)
				}
			}
			if !tc.sorts {
				return
			}

			// Four sorts at once: alice's two (her cap), bob's and
			// carol's. pg_stat_database counts a temporary file's bytes
			// when it is removed and sends them when its backend ends a
			// transaction a second after its last report, goes idle for
			// ten seconds or exits, which the console's connection does
			// after every statement. The demo seed wrote
			// a temporary file of its own (1.4 MB), which a pool
			// connection may report at any time: the replica is stopped,
			// its backends gone (and with them anything they had not
			// reported), and started again, seeded already.
			p.Stop()
			wait.For(t, time.Minute, "the first replica's backends gone", func() bool {
				return count(admin, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE 'studio %'`, tc.db) == 0
			})
			p = studioOn(t, url, 1, flags...)[0]
			temp := func() (files, bytes int64) {
				if err := admin.QueryRow(ctx, `SELECT temp_files, temp_bytes FROM pg_stat_database WHERE datname = $1`, tc.db).
					Scan(&files, &bytes); err != nil {
					t.Fatal(err)
				}
				return files, bytes
			}
			files0, bytes0 := temp()
			peak := observePeak(t, cluster.URL(tc.db), "temp-42")
			answers := make([]*response, 4)
			var wg sync.WaitGroup
			for i, token := range []string{"alice-token", "alice-token", "bob-token", "carol-token"} {
				wg.Add(1)
				go func() {
					defer wg.Done()
					r, err := send(ctx, http.MethodPost, p.URL+"/api/sql", token, console(statement))
					if err != nil {
						r = &response{Body: []byte(err.Error())}
					}
					answers[i] = r
				}()
			}
			wg.Wait()
			ran := peak()
			if ran < 2 {
				t.Errorf("at most %d of the four sorts ran at once", ran)
			}
			// A backend reports its counts before it leaves
			// pg_stat_activity: once no console backend of the database
			// is left, the four statements' files are all counted.
			wait.For(t, time.Minute, "the four statements' backends gone", func() bool {
				return count(admin, `SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND application_name LIKE '% console'`, tc.db) == 0
			})
			files, bytes := temp()
			files, bytes = files-files0, bytes-bytes0
			if files < 4 {
				t.Errorf("pg_stat_database counted %d temporary files of four sorts that spill: the observer is blind", files)
			}
			t.Logf("four sorts (%d at once at most) wrote %d temporary files, %.1f MB in all (temp_file_limit 8 MB each)", ran, files, float64(bytes)/(1<<20))
			for i, r := range answers {
				if tc.temp {
					m := r.problemOf(t, http.StatusBadRequest, "invalid-sql")
					if m["sqlstate"] != "53400" || !strings.Contains(fmt.Sprint(m["detail"]), "-sql-console-temp-file-limit") {
						t.Errorf("sort %d: %v; want SQLSTATE 53400 and a detail naming -sql-console-temp-file-limit", i, m)
					}
				} else if r.Status != http.StatusOK {
					t.Errorf("sort %d without temp_file_limit: %d %s", i, r.Status, r.Body)
				}
			}
			if tc.temp && (bytes > 4*tempLimit || bytes == 0) {
				t.Errorf("four statements wrote %d bytes of temporary files; want some, and at most 4 × %d", bytes, tempLimit)
			}
			if !tc.temp && bytes <= 4*tempLimit {
				t.Errorf("without temp_file_limit the four sorts wrote %d bytes, not more than 4 × %d: the observer is blind", bytes, tempLimit)
			}
		})
	}
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// TestConsoleRoleNamesAreKeyed: a console user's role is named with the
// installation's secret, not a hash anyone can compute: no role of the
// cluster is 'studio_console_' || left(md5(database || '/' || username), 16)
// of a user who used the console; a role of that old name (carol's, made
// by the previous version) is renamed on her next statement and keeps
// reading the history tables; a console role cannot read the secret; and
// a new installation under the same database name gives alice another
// name.
func TestConsoleRoleNamesAreKeyed(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 2)
	ctx := context.Background()
	exec := func(pool *pgxpool.Pool, sql string) {
		t.Helper()
		if _, err := pool.Exec(ctx, sql); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
	}
	oldName := func(user string) string {
		sum := md5.Sum([]byte("app/" + user))
		return "studio_console_" + hex.EncodeToString(sum[:])[:16]
	}
	keyed := regexp.MustCompile(`^studio_console_[0-9a-f]{16}$`)
	exec(admin, `CREATE DATABASE app`)
	procs := studioOn(t, cluster.URL("app"), 1)
	app := pgtest.Pool(t, cluster.URL("app"), 1)

	// carol's console role as the previous version made it.
	exec(admin, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'old'`, oldName("carol")))
	exec(app, fmt.Sprintf(`GRANT SELECT ON audit_event, event, alert, message_flow TO %s`, oldName("carol")))
	exec(app, fmt.Sprintf(`INSERT INTO console_login (username, role_name, password) VALUES ('carol', '%s', 'old')`, oldName("carol")))

	who := func(base, token string) (string, float64) {
		t.Helper()
		rows := call(t, http.MethodPost, base+"/api/sql", token, console(`SELECT session_user::text, count(*) FROM audit_event`)).rows(t)
		row := as[[]any](t, rows[0], "row")
		return as[string](t, row[0], "session user"), as[float64](t, row[1], "count")
	}
	names := map[string]string{}
	for _, user := range []string{"alice", "bob", "carol"} {
		name, n := who(procs[0].URL, user+"-token")
		names[user] = name
		if !keyed.MatchString(name) || name == oldName(user) || n < 100000 {
			t.Errorf("%s's console role %q read %v audit events; want a keyed name (not %s) and the demo's 100,000", user, name, n, oldName(user))
		}
	}
	if names["alice"] == names["bob"] || names["bob"] == names["carol"] || names["alice"] == names["carol"] {
		t.Errorf("two users share a console role: %v", names)
	}
	var roles []string
	if err := admin.QueryRow(ctx, `SELECT coalesce(array_agg(rolname::text), '{}') FROM pg_roles WHERE rolname LIKE 'studio_console_%'`).Scan(&roles); err != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"alice", "bob", "carol", "(probe)"} {
		if contains(roles, oldName(user)) {
			t.Errorf("pg_roles has %s, the md5 of app/%s: anyone can tell %s uses the console (roles %v)", oldName(user), user, user, roles)
		}
	}
	if !contains(roles, names["carol"]) {
		t.Errorf("carol's role %s is not in pg_roles %v", names["carol"], roles)
	}
	r := call(t, http.MethodPost, procs[0].URL+"/api/sql", "alice-token", console(`SELECT key FROM console_role_key`))
	if m := r.problemOf(t, http.StatusBadRequest, "invalid-sql"); m["sqlstate"] != "42501" {
		t.Errorf("alice's console reading the key: %v; want permission denied (42501)", m)
	}

	// Another installation of the same database name: another key.
	procs[0].Stop()
	app.Close()
	exec(admin, `DROP DATABASE app WITH (FORCE)`)
	exec(admin, `CREATE DATABASE app`)
	again := studioOn(t, cluster.URL("app"), 1)
	if name, _ := who(again[0].URL, "alice-token"); name == names["alice"] || !keyed.MatchString(name) {
		t.Errorf("a new installation named alice's role %q, as the first did (%q): the name does not depend on a secret of the installation", name, names["alice"])
	}
}

// TestConsoleInputTheProtocolCannotCarry: a statement with parameters, for
// which the console has no values, is 400 invalid-sql saying parameters are
// not supported (it was a 500); a NUL character in the statement, which
// PostgreSQL's protocol cannot carry, is 400 invalid-sql (it was 503
// database-unavailable, which pages an operator). The console answers
// the next statement.
func TestConsoleInputTheProtocolCannotCarry(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1)
	url := procs[0].URL + "/api/sql"
	for _, tc := range []struct{ sql, detail string }{
		{"select $1", "Parameters ($1, $2, …) are not supported"},
		{"SELECT $1::int + $2::int", "Parameters ($1, $2, …) are not supported"},
		{"SELECT count(*) FROM audit_event WHERE actor = $1", "Parameters ($1, $2, …) are not supported"},
		{"SELECT 'a\x00b'", "NUL character"},
		{"SELECT 1 /* \x00 */", "NUL character"},
		{"SELECT 1\x00", "NUL character"},
		{"\x00", "NUL character"},
	} {
		r := call(t, http.MethodPost, url, "alice-token", console(tc.sql))
		m := r.problemOf(t, http.StatusBadRequest, "invalid-sql")
		if !strings.Contains(fmt.Sprint(m["detail"]), tc.detail) {
			t.Errorf("%q: detail %q; want it to say %q", tc.sql, m["detail"], tc.detail)
		}
		if rows := call(t, http.MethodPost, url, "alice-token", console("SELECT 1")).rows(t); len(rows) != 1 {
			t.Errorf("after %q: SELECT 1 answered %v", tc.sql, rows)
		}
	}
	// A dollar sign that is no parameter still runs.
	rows := call(t, http.MethodPost, url, "alice-token", console("SELECT '$1' AS a, $$x$$ AS b")).rows(t)
	if fmt.Sprint(rows) != "[[$1 x]]" {
		t.Errorf("SELECT '$1', $$x$$: %v", rows)
	}
}

// TestConsoleStringAggMemory measures the memory of the string_agg
// statement at the default bounds (-sql-console-time 30s, work_mem 16MB,
// temp_file_limit 256MB), as the peak resident set (VmHWM) of the backend
// that runs it, polled from /proc while it runs. PostgreSQL 15 has no
// per-backend memory cap. As filed (generate_series in FROM, which
// materialises the series), the statement now stops at temp_file_limit,
// 400 invalid-sql 53400, in a backend of a few hundred MB at most; it ran
// to the time bound before. Written so that nothing spills (the series in
// the select list), it grows its ten strings until the time bound stops it
// (503 heavy-request-timed-out), and its backend, and with it the memory,
// is gone once the answer is out. SECURITY.md states the figures.
func TestConsoleStringAggMemory(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 1)
	ctx := context.Background()
	if _, err := admin.Exec(ctx, `CREATE DATABASE app`); err != nil {
		t.Fatal(err)
	}
	p := studioOn(t, cluster.URL("app"), 1)[0]
	obs := pgtest.Pool(t, cluster.URL("app"), 1)

	// run sends the statement and polls its backend's peak resident set
	// until the backend exits; it returns the answer and the peak in kB,
	// and logs the backend's CPU time (utime + stime, in clock ticks of
	// 10 ms) last read.
	run := func(marker, sql string) (*response, int64) {
		t.Helper()
		answer := make(chan *response, 1)
		go func() {
			r, err := send(ctx, http.MethodPost, p.URL+"/api/sql", "alice-token", console(sql+" /* "+marker+" */"))
			if err != nil {
				r = &response{Body: []byte(err.Error())}
			}
			answer <- r
		}()
		var pid int
		for pid == 0 {
			select {
			case r := <-answer:
				t.Fatalf("%s: answered before its backend was seen: %d %s", marker, r.Status, r.Body)
			default:
			}
			_ = obs.QueryRow(ctx, `SELECT pid FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND strpos(query, $1) > 0`, marker).Scan(&pid)
			time.Sleep(10 * time.Millisecond)
		}
		status := fmt.Sprintf("/proc/%d/status", pid)
		var peak, ticks int64
		for {
			b, err := os.ReadFile(status)
			if err != nil {
				break // the backend exited
			}
			if kb := statusKB(string(b), "VmHWM"); kb > peak {
				peak = kb
			}
			if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil {
				// The fields after the command's closing parenthesis:
				// utime and stime are the 12th and 13th.
				if i := strings.LastIndexByte(string(st), ')'); i > 0 {
					if f := strings.Fields(string(st[i+1:])); len(f) > 12 {
						var u, s int64
						fmt.Sscan(f[11], &u)
						fmt.Sscan(f[12], &s)
						ticks = max(ticks, u+s)
					}
				}
			}
			time.Sleep(50 * time.Millisecond)
		}
		if ticks > 0 {
			t.Logf("%s: peak RSS %d MB after %.1f s of CPU: %.0f MB per CPU second", marker, peak>>10, float64(ticks)/100, float64(peak>>10)/(float64(ticks)/100))
		}
		select {
		case r := <-answer:
			return r, peak
		case <-time.After(2 * time.Minute):
			t.Fatalf("%s: its backend exited and no answer came", marker)
		}
		return nil, 0
	}

	r, peak := run("agg-as-filed-42", "SELECT string_agg(md5(g::text), ',') FROM generate_series(1, 100000000) g GROUP BY g % 10")
	t.Logf("string_agg as filed: peak RSS of its backend %d MB; %d %.300s", peak>>10, r.Status, r.Body)
	if m := r.problemOf(t, http.StatusBadRequest, "invalid-sql"); m["sqlstate"] != "53400" {
		t.Errorf("string_agg as filed: %v; want it stopped by temp_file_limit (53400)", m)
	}
	if peak <= 0 || peak > 512<<10 {
		t.Errorf("string_agg as filed: its backend's peak RSS %d kB; want at most 512 MB", peak)
	}

	r, peak = run("agg-in-memory-42", "SELECT string_agg(md5(g::text), ',') FROM (SELECT generate_series(1, 1000000000) g) s GROUP BY g % 10")
	t.Logf("string_agg without spilling: peak RSS of its backend %d MB at the 30 s time bound; %d %.300s", peak>>10, r.Status, r.Body)
	r.problemOf(t, http.StatusServiceUnavailable, "heavy-request-timed-out")
	// The ten strings grew past work_mem (16 MB): the observer saw the
	// backend that held them, and it is gone.
	if peak < 64<<10 {
		t.Errorf("string_agg without spilling: peak RSS %d kB; want the observer to see it grow past 64 MB", peak)
	}
}

// statusKB reads a "Name:  N kB" line of a /proc status file's text; 0
// when it has none.
func statusKB(status, name string) int64 {
	for _, line := range strings.Split(status, "\n") {
		if v, ok := strings.CutPrefix(line, name+":"); ok {
			var n int64
			fmt.Sscan(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), &n)
			return n
		}
	}
	return 0
}
