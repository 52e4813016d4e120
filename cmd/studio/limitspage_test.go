package main_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestLimitsPageInBrowser: an operator signs in on /limits and sees a
// permit the test holds, the refusals the test caused (of a limit that
// refuses, and of one in dry run), a sign-in throttle and an upload
// window; a second refusal appears without a reload (the page refreshes
// its live part itself). A screenshot is kept: $LIMITS_SCREENSHOT, or a
// file in the system's temp folder, logged.
func TestLimitsPageInBrowser(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-sql-console-cap", "1", "-sign-in-failures", "2", "-uploads-per-hour", "1", "-dry-run", "uploads")
	base := procs[0].URL

	// The test holds alice's console permit through pglimit's public API,
	// as another replica would.
	holdPermit(t, pgtest.Pool(t, dbURL, 2), "sql-console", "alice", 4, "held-by-the-test")
	call(t, http.MethodPost, base+"/api/sql", "alice-token", console("SELECT 1")).problemOf(t, http.StatusTooManyRequests, "too-many-heavy-requests")
	// A throttled username, and an upload over the limit let through in
	// dry run.
	for _, want := range []int{401, 401, 429} {
		if r := call(t, http.MethodPost, base+"/api/session", "", map[string]string{"username": "mallory", "password": "x"}); r.Status != want {
			t.Fatalf("mallory's sign-in: %d, want %d", r.Status, want)
		}
	}
	for i := range 2 {
		if r := upload(t, base, "bob-token", "p.jar", fmt.Appendf(nil, "plugin %d", i)); r.Status != http.StatusCreated {
			t.Fatalf("bob's upload in dry run: %d %s", r.Status, r.Body)
		}
	}

	b := browser(t)
	err := chromedp.Do(b,
		chromedp.Navigate(base+"/limits"),
		chromedp.WaitVisible(`#token`),
		chromedp.SendKeys(`#token`, "alice-token"),
		chromedp.Click(`#go`),
		chromedp.WaitVisible(`#permits tr.permit[data-endpoint="sql-console"][data-scope="user"][data-holder="alice"]`),
		// The refusal is written within a second or two; the page shows it
		// on a refresh of its own.
		chromedp.WaitVisible(`#refusals tr[data-limit="sql-console"][data-refused="1"]`),
		chromedp.WaitVisible(`#refusals tr[data-limit="sign-in"][data-refused="1"]`),
		chromedp.WaitVisible(`#refusals tr[data-limit="uploads"][data-refused="0"][data-dry-run-refused="1"]`),
		chromedp.WaitVisible(`#throttles tr[data-key="username:mallory"]`),
		chromedp.WaitVisible(`#uploads tr[data-user="bob"]`),
	)
	if err != nil {
		t.Fatal(err)
	}
	row := text(t, b, `#permits tr.permit[data-scope="user"]`)
	if !strings.Contains(row, "held-by-the-test") {
		t.Errorf("the permit's row %q does not name the replica holding it", row)
	}
	if bars := countIn(t, b, `#refusals tr[data-limit="sql-console"] svg rect.bar-refused`); bars != 1 {
		t.Errorf("%d refusal bars for sql-console, want 1", bars)
	}
	if !strings.Contains(text(t, b, `#refusals tr[data-limit="uploads"]`), "dry run") {
		t.Error("the uploads limit runs in dry run, and the page does not say so")
	}
	if bars := countIn(t, b, `#refusals tr[data-limit="uploads"] svg rect.bar-dry`); bars != 1 {
		t.Errorf("%d dry-run bars for uploads, want 1", bars)
	}
	// bob's second upload passed in dry run without a slot: one counts.
	if got := text(t, b, `#uploads tr[data-user="bob"] td.n`); got != "1" {
		t.Errorf("bob's uploads in the window: %q, want 1", got)
	}

	// A second refusal, and no reload: a mark set on the window survives.
	if _, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.sameDocument = true`)); err != nil {
		t.Fatal(err)
	}
	call(t, http.MethodPost, base+"/api/sql", "alice-token", console("SELECT 1")).problemOf(t, http.StatusTooManyRequests, "too-many-heavy-requests")
	if err := chromedp.Do(b, chromedp.WaitVisible(`#refusals tr[data-limit="sql-console"][data-refused="2"]`)); err != nil {
		t.Fatal(err)
	}
	same, err := chromedp.Run(b, chromedp.Evaluate[bool](`window.sameDocument === true`))
	if err != nil || !same {
		t.Errorf("the page was reloaded to show the new refusal (%v)", err)
	}

	if err := chromedp.Do(b, chromedp.EmulateViewport(1100, 900)); err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(b, chromedp.FullScreenshot(100)) // quality 100: PNG
	if err != nil {
		t.Fatal(err)
	}
	path := os.Getenv("LIMITS_SCREENSHOT")
	if path == "" {
		path = filepath.Join(os.TempDir(), "pglimit-limits-page-"+time.Now().Format("20060102-150405")+".png")
	}
	if err := os.WriteFile(path, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot of /limits: %s", path)
}

// TestLimitsForOperatorsOnly: bob and carol are no operators: the page,
// its live part and the API view answer them 403 forbidden, and the
// page's form does not let their token in; without a token the page shows
// its form, and the API and the live part answer 401.
func TestLimitsForOperatorsOnly(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1)
	base := procs[0].URL
	for _, token := range []string{"bob-token", "carol-token"} {
		for _, path := range []string{"/limits", "/limits/live", "/api/limits"} {
			call(t, http.MethodGet, base+path, token, nil).problemOf(t, http.StatusForbidden, "forbidden")
		}
		r := postForm(t, base+"/limits", "token="+token)
		if r.Status != http.StatusForbidden || !strings.Contains(string(r.Body), "operators only") || r.Header.Get("Set-Cookie") != "" {
			t.Errorf("form with %s: %d %q, cookie %q", token, r.Status, r.Body, r.Header.Get("Set-Cookie"))
		}
	}
	for _, path := range []string{"/limits/live", "/api/limits"} {
		call(t, http.MethodGet, base+path, "", nil).problemOf(t, http.StatusUnauthorized, "unauthorized")
	}
	r := call(t, http.MethodGet, base+"/limits", "", nil)
	if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `id="signin"`) {
		t.Errorf("/limits without a token: %d, want the form", r.Status)
	}
	r = postForm(t, base+"/limits", "token=alice-token")
	if r.Status != http.StatusSeeOther || !strings.Contains(r.Header.Get("Set-Cookie"), "Path=/limits") {
		t.Errorf("form with alice-token: %d, cookie %q", r.Status, r.Header.Get("Set-Cookie"))
	}
	for _, path := range []string{"/limits", "/limits/live"} {
		r := call(t, http.MethodGet, base+path, "alice-token", nil)
		if r.Status != http.StatusOK || !strings.Contains(string(r.Body), `id="refusals"`) {
			t.Errorf("%s for alice: %d", path, r.Status)
		}
		if csp := r.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe-eval") {
			t.Errorf("%s: Content-Security-Policy %q", path, csp)
		}
	}
}

func countIn(t *testing.T, ctx context.Context, sel string) int {
	t.Helper()
	n, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll('`+sel+`').length`))
	if err != nil {
		t.Fatal(err)
	}
	return n
}
