package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// quickStartBlocks returns the fenced sh blocks of the README's "Quick
// start" section, as lists of command lines.
func quickStartBlocks(t *testing.T) [][]string {
	t.Helper()
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var blocks [][]string
	var block []string
	inSection, inBlock := false, false
	sc := bufio.NewScanner(bytes.NewReader(readme))
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			inSection = line == "## Quick start"
		case !inSection:
		case !inBlock && line == "```sh":
			inBlock, block = true, nil
		case inBlock && line == "```":
			inBlock = false
			blocks = append(blocks, block)
		case inBlock && strings.TrimSpace(line) != "":
			block = append(block, line)
		}
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no Quick start section with sh blocks")
	}
	return blocks
}

// quickStartPort is the port the quick start's commands name; the test
// puts the port of the service it started in its place, and nothing else.
var quickStartPort = regexp.MustCompile(`\b(localhost|127\.0\.0\.1):8080\b`)

// statusMark ends what curl prints for a command, by a .curlrc of the
// test's own (CURL_HOME): the command runs as written, and the test still
// learns the status and the Content-Type of the answer.
const statusMark = "\n@@readme-test "

// TestReadmeQuickStart runs the README's Quick start as a newcomer would,
// from README.md itself: every curl command as written (through sh, with
// only the port replaced by the port of a service the test started with
// the demo data) must answer a 2xx status with a JSON body, and the
// replicas command must start three replicas that answer /readyz. A
// command the test cannot run is skipped by name with the reason; a
// command it does not know fails it, so the section cannot grow untested.
func TestReadmeQuickStart(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("curl"); err != nil {
		t.Fatal("the quick start uses curl, and there is none on PATH")
	}
	procs, dbURL := studio(t, 1)
	port := strings.TrimPrefix(procs[0].Addr, "127.0.0.1:")
	curlHome := t.TempDir()
	if err := os.WriteFile(filepath.Join(curlHome, ".curlrc"),
		[]byte(`write-out = "`+strings.ReplaceAll(statusMark, "\n", `\n`)+`%{http_code} %{content_type}"`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	ran := 0
	for _, block := range quickStartBlocks(t) {
		if strings.HasPrefix(block[0], "export ") {
			t.Run("replicas", func(t *testing.T) { runReplicasBlock(t, block, dbURL) })
			ran++
			continue
		}
		for _, line := range block {
			command, _, _ := strings.Cut(line, "#") // the comment is not the command's name
			name := strings.Join(strings.Fields(command)[:min(3, len(strings.Fields(command)))], " ")
			t.Run(name, func(t *testing.T) {
				switch fields := strings.Fields(line); fields[0] {
				case "make":
					if len(fields) > 1 && fields[1] == "run" {
						t.Skip("make run starts the service; this test started the same binary (go run ./cmd/studio) with the demo data on a free port")
					}
					if len(fields) > 1 && fields[1] == "test" {
						t.Skip("make test is the test suite this test is part of")
					}
				case "open":
					t.Skip("open shows a page in a browser; TestAuditPageInBrowser and TestLimitsPageInBrowser drive those pages in chromium")
				case "curl":
					runCurl(t, quickStartPort.ReplaceAllString(line, "${1}:"+port), curlHome)
					ran++
					return
				}
				t.Fatalf("the quick start has a command this test does not know how to run: %q; run it here, or skip it with the reason", line)
			})
		}
	}
	if ran < 5 && !t.Failed() {
		t.Fatalf("ran %d commands of the quick start; it has at least four curl commands and the replicas", ran)
	}
}

// runCurl runs one curl command line through sh and checks its answer.
func runCurl(t *testing.T, line, curlHome string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", line)
	cmd.Env = append(os.Environ(), "CURL_HOME="+curlHome)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v %s", line, err, stderr.Bytes())
	}
	body, tail, ok := strings.Cut(string(out), statusMark)
	if !ok {
		t.Fatalf("%s: no status from curl: %q", line, out)
	}
	status, contentType, _ := strings.Cut(tail, " ")
	code, _ := strconv.Atoi(status)
	if code < 200 || code > 299 {
		t.Fatalf("%s\nanswered %s: %s", line, status, body)
	}
	if !strings.Contains(contentType, "json") || !json.Valid([]byte(body)) {
		t.Fatalf("%s\nanswered %s %q, not JSON: %s", line, status, contentType, body)
	}
	t.Logf("%s → %s %s", line, status, contentType)
}

// runReplicasBlock runs the quick start's replicas commands as one sh
// script, with the test's database in place of the DATABASE_URL it names
// and free ports in place of its ports, and checks every replica answers
// /readyz. The replicas (go run and the servers it starts) are stopped
// with their process group when the test ends.
func runReplicasBlock(t *testing.T, block []string, dbURL string) {
	script := strings.Join(block, "\n")
	named := regexp.MustCompile(`DATABASE_URL=(\S+)`).FindStringSubmatch(script)
	if named == nil {
		t.Fatalf("the replicas commands name no DATABASE_URL:\n%s", script)
	}
	script = strings.Replace(script, named[0], "DATABASE_URL='"+dbURL+"'", 1)
	ports := regexp.MustCompile(`\b80[0-9][0-9]\b`).FindAllString(script, -1)
	if len(ports) < 2 {
		t.Fatalf("the replicas commands name %d ports:\n%s", len(ports), script)
	}
	var bases []string
	for _, p := range ports {
		free, err := replicaset.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		script = strings.Replace(script, p, strconv.Itoa(free), 1)
		bases = append(bases, "http://127.0.0.1:"+strconv.Itoa(free))
	}
	cmd := exec.Command("sh", "-c", script+"\nwait")
	cmd.Dir = filepath.Join("..", "..")
	cmd.Env = envWithout("DATABASE_URL", "TEST_DATABASE_URL", "CURSOR_KEY", "READ_REPLICA_URL")
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
			<-done
		}
	})
	client := &http.Client{Timeout: 2 * time.Second}
	for _, base := range bases {
		deadline := time.Now().Add(3 * time.Minute) // go run builds first
		for {
			resp, err := client.Get(base + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			select {
			case <-done:
				t.Fatalf("the replicas commands ended before %s was ready:\n%s\n%s", base, redactURL(script, dbURL), logs.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s not ready after 3 min:\n%s", base, logs.String())
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	t.Logf("%d replicas ready: %s", len(bases), strings.Join(bases, " "))
}

// redactURL hides the database password in a script shown in a failure.
func redactURL(script, dbURL string) string {
	if u, err := url.Parse(dbURL); err == nil {
		return strings.ReplaceAll(script, dbURL, u.Redacted())
	}
	return script
}

// TestSignInWhateverContentType: POST /api/session reads a JSON body
// whatever its Content-Type says, as the service's other JSON endpoints
// do: `curl -d` (a form type) signs in, and a wrong password sent that way
// counts as a failure of that username.
func TestSignInWhateverContentType(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-sign-in-failures", "1")
	post := func(body string) *response {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, procs[0].URL+"/api/session", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded") // what curl -d sends
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var b bytes.Buffer
		_, _ = b.ReadFrom(resp.Body)
		return &response{Status: resp.StatusCode, Header: resp.Header, Body: b.Bytes()}
	}
	r := post(`{"username":"alice","password":"studio"}`)
	if r.Status != http.StatusOK || as[string](t, r.json(t)["token"], "token") == "" {
		t.Fatalf("sign-in with a form Content-Type: %d %s", r.Status, r.Body)
	}
	post(`{"username":"bob","password":"wrong"}`).problemOf(t, http.StatusUnauthorized, "invalid-credentials")
	post(`{"username":"bob","password":"studio"}`).problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")
	post(`username=carol&password=studio`).problemOf(t, http.StatusBadRequest, "invalid-sign-in-request")
}
