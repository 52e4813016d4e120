package main_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestExportMarks checks the last line of the audit export for each bound,
// and that each export recorded itself as an audit.export event.
func TestExportMarks(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-export-rows", "1000")
	base := procs[0].URL

	r := call(t, http.MethodGet, base+"/api/audit/export", "alice-token", nil)
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("Content-Type"), "text/csv") {
		t.Fatalf("%d %s", r.Status, r.Header.Get("Content-Type"))
	}
	lines := strings.Split(strings.TrimRight(string(r.Body), "\n"), "\n")
	if last := lines[len(lines)-1]; last != "#partial bound=ROWS limit=1000 rows=1000" {
		t.Fatalf("row-capped export ends %q", last)
	}
	if len(lines) != 1002 { // header, 1000 rows, mark
		t.Fatalf("%d lines", len(lines))
	}

	now := time.Now().UTC()
	r = call(t, http.MethodGet, base+"/api/audit/export?from="+now.Add(-10*time.Second).Format(time.RFC3339)+"&to="+now.Add(time.Hour).Format(time.RFC3339), "alice-token", nil)
	lines = strings.Split(strings.TrimRight(string(r.Body), "\n"), "\n")
	if last := lines[len(lines)-1]; !regexp.MustCompile(`^#complete rows=\d+$`).MatchString(last) {
		t.Fatalf("narrow export ends %q", last)
	}

	// A client that reads slowly holds the export of all 100,000 rows
	// (about 6 MB, more than the socket buffers take) past its time bound:
	// it stops there and says so.
	slow := studioOn(t, dbURL, 1, "-export-time", "2s")[0]
	req, _ := http.NewRequest(http.MethodGet, slow.URL+"/api/audit/export", nil)
	req.Header.Set("Authorization", "Bearer bob-token")
	resp, err := smallBufferClient().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	buf := make([]byte, 512)
	for time.Since(start) < 3*time.Second {
		if _, err := resp.Body.Read(buf); err != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	rest, _ := io.ReadAll(resp.Body)
	sc := bufio.NewScanner(strings.NewReader(string(rest)))
	var last string
	for sc.Scan() {
		last = sc.Text()
	}
	m := regexp.MustCompile(`^#partial bound=TIME limit=2s rows=(\d+)$`).FindStringSubmatch(last)
	if m == nil {
		t.Fatalf("slowly read export ends %q", last)
	}
	if n, _ := strconv.Atoi(m[1]); n <= 0 || n >= 100000 {
		t.Fatalf("time-bound export wrote %d rows", n)
	}

	// Every export is in the audit history, with its rows and bound.
	deadline := time.Now().Add(5 * time.Second)
	for {
		r = call(t, http.MethodPost, base+"/api/sql", "alice-token", map[string]string{"sql": `SELECT actor, detail->>'rows', detail->>'partial', coalesce(detail->>'bound', '') FROM audit_event WHERE action = 'audit.export' ORDER BY id`})
		rows := r.rows(t)
		if len(rows) == 3 {
			got := fmt.Sprint(rows)
			if !strings.Contains(got, "[alice 1000 true ROWS]") || !regexp.MustCompile(`\[bob \d+ true TIME\]`).MatchString(got) || !strings.Contains(got, "false ]") {
				t.Fatalf("audit.export events: %s", got)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit.export events: %v", rows)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// smallBufferClient reads through a 4 KiB socket receive buffer, so a
// server writing to it blocks once its own send buffer is full.
func smallBufferClient() *http.Client {
	dialer := &net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		})
		if err != nil {
			return err
		}
		return serr
	}}
	return &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext, DisableCompression: true}}
}

// TestExportDisconnectReleasesPermits: a client that goes away mid-export
// frees its permit, so the next export of the same user (cap 1) runs.
func TestExportDisconnectReleasesPermits(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-export-cap", "1")
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, procs[0].URL+"/api/audit/export", nil)
	req.Header.Set("Authorization", "Bearer carol-token")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = resp.Body.Read(make([]byte, 100))
	// While it runs, the same user is refused on the other replica.
	r := call(t, http.MethodGet, procs[1].URL+"/api/audit/export", "carol-token", nil)
	r.problemOf(t, http.StatusTooManyRequests, "too-many-heavy-requests")
	cancel()
	resp.Body.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r := call(t, http.MethodGet, procs[1].URL+"/api/audit/export?from="+time.Now().Add(-time.Second).UTC().Format(time.RFC3339), "carol-token", nil)
		if r.Status == http.StatusOK {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("permit not released after the client went away: %d %s", r.Status, r.Body)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
