package main_test

import (
	"context"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// TestRunsWithNoDatabase starts the service with no -database-url and no
// DATABASE_URL, as a newcomer's `make run` does: it must start its own
// PostgreSQL and answer /readyz within 30 s, with the demo data seeded,
// and remove that PostgreSQL on SIGTERM.
func TestRunsWithNoDatabase(t *testing.T) {
	t.Parallel()
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	port, _ := replicaset.FreePort()
	base := "http://127.0.0.1:" + strconv.Itoa(port)
	cmd := exec.Command(bin, "-addr", "127.0.0.1:"+strconv.Itoa(port))
	cmd.Env = envWithout("DATABASE_URL", "TEST_DATABASE_URL", "READ_REPLICA_URL")
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("studio exited with %v after SIGTERM\n%s", err, logs.String())
			}
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
			t.Error("studio did not stop within 30 s of SIGTERM")
		}
	}()
	for {
		resp, err := http.Get(base + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("not ready within 30 s:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Logf("ready after %v", time.Since(start).Round(time.Millisecond))

	r := call(t, http.MethodPost, base+"/api/sql", "alice-token", map[string]string{"sql": "SELECT count(*) FROM audit_event"})
	if r.Status != http.StatusOK {
		t.Fatalf("console on the embedded database: %d %s", r.Status, r.Body)
	}
	rows := r.rows(t)
	if len(rows) != 1 {
		t.Fatalf("count(*) answered %d rows: %s", len(rows), r.Body)
	}
	if n := as[float64](t, as[[]any](t, rows[0], "row")[0], "count"); n < 100000 {
		t.Fatalf("demo audit events: %v, want at least 100,000", n)
	}
	_ = context.Background
}

// TestFlags pins flag names: an unknown flag or a bad value stops the
// service with an error before it touches a database.
func TestFlags(t *testing.T) {
	t.Parallel()
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("-h: %v", err)
	}
	for _, name := range []string{
		"-addr", "-database-url", "-read-replica-url", "-replica-name", "-demo", "-pool-max-conns",
		"-sql-console-cap", "-sql-console-time", "-sql-console-rows", "-export-cap", "-export-time", "-export-rows",
		"-history-time", "-history-rows", "-flow-time", "-flow-rows", "-sign-in-failures", "-sign-in-window", "-uploads-per-hour", "-token-in-flight", "-token-in-flight-keep", "-node", "-node-rate",
		"-api-rate", "-api-burst", "-dry-run", "-ban-after", "-ban-within", "-ban-for",
		"-api-quota", "-quota-timezone", "-export-rows-per-day", "-plugin-bytes-per-month",
		"-trusted-proxies", "-client-address-header", "-ipv6-prefix", "-address-rate", "-address-burst",
		"-sign-in-address-failures", "-sign-in-username-failures", "-sign-in-strict", "-api-borrow",
		"-body-timeout", "-max-conns-per-peer", "-sql-console-temp-file-limit", "-sql-console-work-mem", "-demo-users",
	} {
		if !strings.Contains(string(out), "  "+name+" ") && !strings.Contains(string(out), "  "+name+"\n") {
			t.Errorf("-h does not list %s", name)
		}
	}
	for _, args := range [][]string{
		{"-no-such-flag"},
		{"-sql-console-cap", "0"},
		{"-export-time", "-1s"},
		{"-node", "broker"},
		{"-node", "a=ftp://x"},
		{"-node", "a=http://x", "-node", "a=http://y"},
		{"-node-rate", "0"},
		{"-client-address-header", "X-Real-IP"},
		{"-client-address-header", ""},
		{"-body-timeout", "0"},
		{"-max-conns-per-peer", "0"},
		{"-sign-in-username-failures", "-1"},
		{"-demo-users", "-1"},
		{"-token-in-flight-keep", "-1s"},
		{"-history-rows", "199"},
		{"-flow-rows", "0"},
		{"-pool-max-conns", "zero"},
		{"-dry-run", "sql"},
		{"-dry-run", "all,nope"},
		{"extra-argument"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = envWithout("DATABASE_URL")
		out, err := cmd.CombinedOutput()
		if err == nil {
			t.Errorf("studio %v started; want an error", args)
		} else if len(out) == 0 {
			t.Errorf("studio %v failed without saying why", args)
		}
	}
}

// TestDemoUsers: -demo -demo-users 2000 seeds user00001 … user02000 at
// once (one hash for all, a statement for all: the replica is up within
// the harness's start-up bound), each with its token and the demo
// password; user02001 is no user; and a second replica starting on the
// same database seeds nothing twice.
func TestDemoUsers(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-demo-users", "2000")
	for _, u := range []string{"user00001", "user01234", "user02000"} {
		if r := call(t, http.MethodGet, procs[0].URL+"/api/limits/usage?user="+u, u+"-token", nil); r.Status != http.StatusOK {
			t.Errorf("%s's token: %d %s", u, r.Status, r.Body)
		}
	}
	if r := call(t, http.MethodPost, procs[1].URL+"/api/session", "", map[string]string{"username": "user02000", "password": "studio"}); r.Status != http.StatusOK {
		t.Errorf("user02000 signs in: %d %s", r.Status, r.Body)
	}
	call(t, http.MethodGet, procs[1].URL+"/api/limits", "user02001-token", nil).problemOf(t, http.StatusUnauthorized, "unauthorized")
}
