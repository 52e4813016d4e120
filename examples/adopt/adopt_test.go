package main

// The adoption proof, black-box: the example service built as a binary,
// two instances (replicas) of it on one database, driven over HTTP, every
// limit judged from the answers and from an observer on the real server
// (pg_stat_activity for what runs, the service's own login_attempt audit
// for the passwords it checked) — once on the throwaway PostgreSQL of the
// tests, once through PgBouncer 1.18 in transaction pooling mode.

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgbouncer"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The limits the example service sets (service.go), and what the tests
// give it: a pool of 16 connections, so the installation cap of heavy
// requests is 16 / 4.
const (
	signInLimit       = 5 // signin's default
	inFlightLimit     = 4
	reportPerUser     = 2
	installationLimit = 4
	poolMaxConns      = "16"
	queryDelay        = 500 * time.Millisecond
)

// TestAdoptOnPostgres runs two instances of the example service on one
// database of the throwaway PostgreSQL and proves every limit holds.
func TestAdoptOnPostgres(t *testing.T) {
	t.Parallel()
	upstream := pgtest.EmptyURL(t)
	proveAdoption(t, pgbouncer.WithParam(upstream, "pool_max_conns", poolMaxConns), upstream)
}

// TestAdoptBehindPgBouncer runs the two instances through PgBouncer in
// transaction pooling mode (10 server connections for their 32 client
// connections), with the one setting the README asks for:
// default_query_exec_mode=exec on the database URL. Both migrate at once
// through the pooler (their own goose migrations and pglimit.Migrate),
// and every limit holds with no statement failing.
func TestAdoptBehindPgBouncer(t *testing.T) {
	t.Parallel()
	upstream := pgtest.EmptyURL(t)
	b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolSize: 10})
	u := pgbouncer.WithParam(b.URL(upstream), "pool_max_conns", poolMaxConns)
	proveAdoption(t, pgbouncer.WithParam(u, "default_query_exec_mode", "exec"), upstream)
}

// TestAdoptBehindPgBouncerDefaultModeFails is the same service through the
// same PgBouncer without the setting: pgx's default exec mode
// (cache_statement) prepares statements on one server connection and runs
// them on another, and the service fails — an instance that cannot
// migrate, or requests answered 500 with "prepared statement ... already
// exists / does not exist" in its log, or an instance that never becomes
// ready.
func TestAdoptBehindPgBouncerDefaultModeFails(t *testing.T) {
	t.Parallel()
	upstream := pgtest.EmptyURL(t)
	b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolSize: 10})
	u := pgbouncer.WithParam(b.URL(upstream), "pool_max_conns", poolMaxConns)
	procs, err := startInstances(t, u)
	if err != nil {
		switch {
		case strings.Contains(err.Error(), "prepared statement"):
			t.Logf("as expected, an instance did not start: %s", lineWith(err.Error(), "prepared statement"))
		case strings.Contains(err.Error(), "not ready after"):
			// The other way it fails (CI, under load): an instance waits
			// for ever in its migration, behind a statement of the other
			// that failed on a server connection it was not prepared on
			// and left that connection's session holding what it held.
			t.Logf("as expected, an instance did not start: it never became ready (%s)", lineWith(err.Error(), "not ready after"))
		default:
			t.Fatalf("an instance did not start, but neither for a prepared statement nor by hanging: %v", err)
		}
		return
	}
	// Both started: the requests fail instead.
	var failed int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 16 {
		wg.Go(func() {
			status, _ := post(t, procs[i%2].url+"/login", `{"username":"alice","password":"adopt"}`)
			if status == http.StatusInternalServerError || status == http.StatusServiceUnavailable {
				mu.Lock()
				failed++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	logs := procs[0].log() + procs[1].log()
	if failed == 0 || !strings.Contains(logs, "prepared statement") {
		t.Fatalf("pgx's default exec mode behind PgBouncer in transaction mode: %d of 16 sign-ins failed, log mentions prepared statements: %v; want failures",
			failed, strings.Contains(logs, "prepared statement"))
	}
	t.Logf("as expected, %d of 16 sign-ins failed (500/503), the log saying prepared statements are missing or already there", failed)
}

// proveAdoption starts two instances on serviceURL and checks every limit,
// observing the database at observerURL directly.
func proveAdoption(t *testing.T, serviceURL, observerURL string) {
	procs, err := startInstances(t, serviceURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()

	// Tokens first: bob's sign-ins are throttled below.
	tokens := map[string][]string{}
	for _, u := range []string{"alice", "alice", "alice", "bob", "carol", "dave"} {
		status, body := post(t, procs[len(tokens[u])%2].url+"/login", `{"username":"`+u+`","password":"adopt"}`)
		var got struct{ Token string }
		if status != http.StatusOK || json.Unmarshal([]byte(body), &got) != nil || got.Token == "" {
			t.Fatalf("sign-in of %s: %d %s", u, status, body)
		}
		tokens[u] = append(tokens[u], got.Token)
	}

	t.Run("in-flight cap per token", func(t *testing.T) {
		// 16 requests of one token at once, over both instances; each
		// waits half a second in the database.
		watch := watcher(t, observerURL, "/* list-orders */")
		answers := burst(t, procs, 16, func(i int) (string, string) { return "/orders", tokens["alice"][0] })
		peak := watch()
		ok, refused := answers.count(http.StatusOK, ""), answers.count(http.StatusTooManyRequests, "too-many-requests-in-flight")
		if ok+refused != len(answers) {
			t.Fatalf("answers other than 200 and 429 too-many-requests-in-flight: %v", answers)
		}
		if peak > inFlightLimit {
			t.Errorf("observer: %d requests of one token ran at once, over the cap of %d", peak, inFlightLimit)
		}
		if ok < inFlightLimit || refused == 0 || peak < 2 {
			t.Errorf("%d granted, %d refused, at most %d seen at once: the cap of %d was not reached, the test proves nothing", ok, refused, peak, inFlightLimit)
		}
		t.Logf("in flight: cap %d, observed at most %d at once; %d answered, %d refused", inFlightLimit, peak, ok, refused)
	})

	t.Run("heavy per-user cap", func(t *testing.T) {
		// Nine reports of alice at once, three on each of her tokens (each
		// within the in-flight cap), over both instances.
		watch := watcher(t, observerURL, "/* usage-report */")
		answers := burst(t, procs, 9, func(i int) (string, string) { return "/reports/usage", tokens["alice"][i%3] })
		peak := watch()
		ok, refused := answers.count(http.StatusOK, ""), answers.countHeavy("user")
		if ok+refused != len(answers) {
			t.Fatalf("answers other than 200 and 429 too-many-heavy-requests (scope user): %v", answers)
		}
		if peak > reportPerUser {
			t.Errorf("observer: %d reports of one user ran at once, over the cap of %d", peak, reportPerUser)
		}
		if ok < reportPerUser || refused == 0 || peak < 1 {
			t.Errorf("%d granted, %d refused, at most %d seen at once: the cap was not reached", ok, refused, peak)
		}
		t.Logf("heavy, per user: cap %d, observed at most %d at once; %d answered, %d refused", reportPerUser, peak, ok, refused)
	})

	t.Run("heavy installation cap", func(t *testing.T) {
		// Two reports of each of four users at once (each within the
		// per-user cap), over both instances: eight against a cap of four.
		users := []string{"alice", "bob", "carol", "dave"}
		watch := watcher(t, observerURL, "/* usage-report */")
		answers := burst(t, procs, 8, func(i int) (string, string) { return "/reports/usage", tokens[users[i%4]][0] })
		peak := watch()
		ok, refused := answers.count(http.StatusOK, ""), answers.countHeavy("installation")
		if ok+refused != len(answers) {
			t.Fatalf("answers other than 200 and 429 too-many-heavy-requests (scope installation): %v", answers)
		}
		if peak > installationLimit {
			t.Errorf("observer: %d reports ran at once, over the installation cap of %d", peak, installationLimit)
		}
		if ok < installationLimit || refused == 0 || peak < 2 {
			t.Errorf("%d granted, %d refused, at most %d seen at once: the cap was not reached", ok, refused, peak)
		}
		t.Logf("heavy, installation: cap %d, observed at most %d at once; %d answered, %d refused", installationLimit, peak, ok, refused)
	})

	t.Run("sign-in throttle", func(t *testing.T) {
		audited := func() int {
			var n int
			if err := pgtest.Pool(t, observerURL, 1).QueryRow(ctx, `SELECT count(*) FROM public.login_attempt WHERE username = 'bob' AND NOT succeeded`).Scan(&n); err != nil {
				t.Fatal(err)
			}
			return n
		}
		before := audited()
		// 16 wrong passwords for bob at once, over both instances.
		answers := make(answerList, 16)
		var wg sync.WaitGroup
		for i := range answers {
			wg.Go(func() {
				answers[i].status, answers[i].body = post(t, procs[i%2].url+"/login", `{"username":"bob","password":"guess`+strconv.Itoa(i)+`"}`)
			})
		}
		wg.Wait()
		failed, throttled := answers.count(http.StatusUnauthorized, ""), answers.count(http.StatusTooManyRequests, "too-many-failed-sign-ins")
		if failed+throttled != len(answers) {
			t.Fatalf("answers other than 401 and 429 too-many-failed-sign-ins: %v", answers)
		}
		// Strict mode: exactly the limit of passwords is checked, however
		// many arrive at once; the service's own audit counts them.
		checked := audited() - before
		if failed != signInLimit || checked != signInLimit {
			t.Errorf("16 wrong passwords at once: %d answered 401, %d passwords checked (the service's audit); want exactly %d", failed, checked, signInLimit)
		}
		// Now bob is throttled on every instance, with the right password too.
		for _, p := range procs {
			if status, body := post(t, p.url+"/login", `{"username":"bob","password":"adopt"}`); status != http.StatusTooManyRequests {
				t.Errorf("%s: bob's right password after %d failures: %d %s, want 429", p.name, signInLimit, status, body)
			}
		}
		// A JSON sign-in labelled text/plain is counted like any other: bob
		// stays throttled, no password is checked.
		req, _ := http.NewRequest(http.MethodPost, procs[0].url+"/login", strings.NewReader(`{"username":"bob","password":"adopt"}`))
		req.Header.Set("Content-Type", "text/plain")
		if status, body := do(t, req); status != http.StatusTooManyRequests {
			t.Errorf("bob's sign-in as text/plain: %d %s, want 429 (JSON is read whatever its label)", status, body)
		}
		// A body the throttle cannot read is refused by it: no password is
		// checked.
		req, _ = http.NewRequest(http.MethodPost, procs[0].url+"/login", strings.NewReader(`password=adopt`))
		req.Header.Set("Content-Type", "text/plain")
		if status, body := do(t, req); status != http.StatusBadRequest {
			t.Errorf("a sign-in without a username: %d %s, want 400 (the throttle could not read it, so no password is checked)", status, body)
		}
		if checked := audited() - before; checked != signInLimit {
			t.Errorf("%d of bob's passwords checked in all, want %d", checked, signInLimit)
		}
		t.Logf("sign-in: limit %d, 16 wrong passwords at once: %d checked (401), %d throttled (429)", signInLimit, failed, throttled)
	})

	// Side by side: the service's tables and pglimit's, each with its own
	// goose history.
	observer := pgtest.Pool(t, observerURL, 1)
	var teamReplicas, pglimitReplicas, histories int
	err = observer.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM public.replica WHERE version = $1),
		(SELECT count(*) FROM pglimit.replica WHERE name = ANY($2)),
		(SELECT count(*) FROM information_schema.tables WHERE table_name = 'goose_db_version' AND table_schema IN ('public', 'pglimit'))`,
		version, []string{procs[0].name, procs[1].name}).Scan(&teamReplicas, &pglimitReplicas, &histories)
	if err != nil || teamReplicas != 2 || pglimitReplicas != 2 || histories != 2 {
		t.Errorf("the service's replica rows %d, pglimit's %d, goose histories %d (%v); want 2, 2, 2", teamReplicas, pglimitReplicas, histories, err)
	}

	// No statement failed: nothing logged above INFO, and both instances
	// stop cleanly (pglimit.Run returned no error).
	for _, p := range procs {
		if err := p.stop(); err != nil {
			t.Errorf("%s: %v", p.name, err)
		}
		if lines := p.problems(); len(lines) > 0 {
			t.Errorf("%s logged %d warnings or errors, the first: %s", p.name, len(lines), lines[0])
		}
	}
}

// instance is one running instance of the example service.
type instance struct {
	name, url, logPath string
	cmd                *exec.Cmd
	done               chan struct{}
	err                error
}

// startInstances builds the service and starts two instances on
// databaseURL at once, and waits until both answer /healthz. They are
// stopped when the test ends.
func startInstances(t *testing.T, databaseURL string) ([]*instance, error) {
	t.Helper()
	dir := t.TempDir()
	bin := filepath.Join(dir, "adopt")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	procs := make([]*instance, 2)
	for i := range procs {
		port, err := replicaset.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		p := &instance{name: fmt.Sprintf("adopt-%d", i+1), url: fmt.Sprintf("http://127.0.0.1:%d", port),
			logPath: filepath.Join(dir, fmt.Sprintf("adopt-%d.log", i+1)), done: make(chan struct{})}
		logf, err := os.Create(p.logPath)
		if err != nil {
			t.Fatal(err)
		}
		p.cmd = exec.Command(bin, "-addr", strings.TrimPrefix(p.url, "http://"), "-database-url", databaseURL,
			"-name", p.name, "-demo", "-query-delay", queryDelay.String())
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		go func() { p.err = p.cmd.Wait(); logf.Close(); close(p.done) }()
		t.Cleanup(func() { _ = p.stop() })
		procs[i] = p
	}
	for _, p := range procs {
		if err := p.waitReady(90 * time.Second); err != nil {
			return nil, err
		}
	}
	return procs, nil
}

func (p *instance) waitReady(timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		resp, err := http.Get(p.url + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("%s exited before it was ready (%v); its log:\n%s", p.name, p.err, p.log())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s not ready after %v; its log:\n%s", p.name, timeout, p.log())
		}
	}
}

// stop sends SIGTERM and waits: an error when the instance did not exit 0.
func (p *instance) stop() error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
		return errors.New("did not stop within 30s of SIGTERM")
	}
	if p.err != nil {
		return fmt.Errorf("exited with %v; its log:\n%s", p.err, p.log())
	}
	return nil
}

func (p *instance) log() string {
	b, _ := os.ReadFile(p.logPath)
	return string(b)
}

// problems are the log lines above INFO.
func (p *instance) problems() []string {
	var out []string
	sc := bufio.NewScanner(strings.NewReader(p.log()))
	for sc.Scan() {
		var line struct{ Level string }
		if json.Unmarshal(sc.Bytes(), &line) != nil || (line.Level != "INFO" && line.Level != "DEBUG") {
			out = append(out, sc.Text())
		}
	}
	return out
}

// answer is one HTTP answer.
type answer struct {
	status int
	body   string
}

type answerList []answer

func (a answer) String() string { return fmt.Sprintf("%d %s", a.status, strings.TrimSpace(a.body)) }

// count counts the answers with status whose problem type ends with slug
// ("" for any body).
func (l answerList) count(status int, slug string) int {
	n := 0
	for _, a := range l {
		if a.status != status {
			continue
		}
		var p struct{ Type string }
		if slug == "" || json.Unmarshal([]byte(a.body), &p) == nil && strings.HasSuffix(p.Type, ":"+slug) {
			n++
		}
	}
	return n
}

// countHeavy counts the 429 too-many-heavy-requests of the usage report
// whose scope is scope.
func (l answerList) countHeavy(scope string) int {
	n := 0
	for _, a := range l {
		var p struct {
			Type, Endpoint, Scope string
			Limit                 int
		}
		if a.status == http.StatusTooManyRequests && json.Unmarshal([]byte(a.body), &p) == nil &&
			strings.HasSuffix(p.Type, ":too-many-heavy-requests") && p.Endpoint == "usage-report" && p.Scope == scope {
			n++
		}
	}
	return n
}

// burst sends n GET requests at once, the i-th to instance i%2 with the
// path and token request(i) gives, and returns the answers.
func burst(t *testing.T, procs []*instance, n int, request func(i int) (path, token string)) answerList {
	t.Helper()
	answers := make(answerList, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range answers {
		path, token := request(i)
		req, _ := http.NewRequest(http.MethodGet, procs[i%2].url+path, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		wg.Go(func() {
			<-start
			answers[i].status, answers[i].body = do(t, req)
		})
	}
	close(start)
	wg.Wait()
	return answers
}

// watcher samples the statements carrying marker on the real server until
// the returned function is called, which returns the most seen at once.
func watcher(t *testing.T, url, marker string) func() int {
	t.Helper()
	w, err := activity.Watch(t.Context(), url, marker)
	if err != nil {
		t.Fatal(err)
	}
	return func() int {
		peak, samples, err := w.Stop()
		if err != nil {
			t.Fatalf("observer: %v", err)
		}
		// It ran; whether it saw the burst each phase judges itself (at
		// least one or two statements at once, or the phase proves
		// nothing). Ten samples were asked before, which a machine this
		// loaded (two test runs and two CPU hogs on two cores) did not
		// give in a phase of 0.6 s (it took one).
		if samples < 1 {
			t.Fatalf("observer: only %d samples", samples)
		}
		return peak
	}
}

var client = &http.Client{Timeout: time.Minute}

func do(t *testing.T, req *http.Request) (int, string) {
	resp, err := client.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", req.Method, req.URL, err)
		return 0, ""
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	return do(t, req)
}

// lineWith is the first line of s that contains sub.
func lineWith(s, sub string) string {
	for line := range strings.Lines(s) {
		if strings.Contains(line, sub) {
			return strings.TrimSpace(line)
		}
	}
	return ""
}
