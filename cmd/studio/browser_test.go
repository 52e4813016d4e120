package main_test

import (
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
)

// browser starts a headless Chromium (Debian's package) for one test.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Fatalf("no chromium on PATH: install Debian's chromium package (apt-get install chromium); make test does when run as root")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	ctx, cancelTimeout := context.WithTimeout(ctx, 2*time.Minute)
	t.Cleanup(func() { cancelTimeout(); cancel(); cancelAlloc() })
	return ctx
}

func ids(t *testing.T, ctx context.Context) []int64 {
	t.Helper()
	texts, err := chromedp.Run(ctx, chromedp.Evaluate[[]string](`Array.from(document.querySelectorAll('#rows td.id')).map(e => e.textContent)`))
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(texts))
	for i, s := range texts {
		out[i], _ = strconv.ParseInt(s, 10, 64)
	}
	return out
}

// TestAuditPageInBrowser signs in with a token on /audit, pages by number,
// reaches the last page numbers reach, and follows the cursor from there.
func TestAuditPageInBrowser(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1)
	base := procs[0].URL
	ctx := browser(t)

	err := chromedp.Do(ctx,
		chromedp.Navigate(base+"/audit"),
		chromedp.WaitVisible(`#token`),
		chromedp.SendKeys(`#token`, "alice-token"),
		chromedp.Click(`#go`),
		chromedp.WaitVisible(`#rows`),
		chromedp.WaitReady(`#end`),
	)
	if err != nil {
		t.Fatal(err)
	}
	position := text(t, ctx, `#position`)
	if !strings.Contains(position, "Rows 1–50 of more than 10000, page 1") {
		t.Fatalf("first page says %q", position)
	}
	first := ids(t, ctx)
	if err := chromedp.Do(ctx, chromedp.Click(`#next`), chromedp.WaitVisible(`#prev`), chromedp.WaitReady(`#end`)); err != nil {
		t.Fatal(err)
	}
	position = text(t, ctx, `#position`)
	second := ids(t, ctx)
	if len(first) != 50 || len(second) != 50 || overlap(first, second) || !strings.Contains(position, "page 2") {
		t.Fatalf("page 2 (%q) does not follow page 1", position)
	}

	// The last page numbers reach offers the cursor instead of a number.
	if err := chromedp.Do(ctx, chromedp.Navigate(base+"/audit?page=200&size=50"), chromedp.WaitVisible(`#older`), chromedp.WaitReady(`#end`)); err != nil {
		t.Fatal(err)
	}
	hasNext := exists(t, ctx, `#next`)
	if hasNext {
		t.Fatal("page 200 of 50 offers a page 201")
	}
	last := ids(t, ctx)
	if err := chromedp.Do(ctx, chromedp.Click(`#older`), chromedp.WaitVisible(`#newest`), chromedp.WaitReady(`#end`)); err != nil {
		t.Fatal(err)
	}
	position = text(t, ctx, `#position`)
	older := ids(t, ctx)
	if !strings.Contains(position, "read by cursor") || len(older) != 50 {
		t.Fatalf("cursor page says %q with %d rows", position, len(older))
	}
	if overlap(last, older) {
		t.Fatalf("the cursor page repeats rows of page 200")
	}
	if exists(t, ctx, `#may-lag`) {
		t.Fatal("the primary's rows carry the replica notice")
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func exists(t *testing.T, ctx context.Context, sel string) bool {
	t.Helper()
	ok, err := chromedp.Run(ctx, chromedp.Evaluate[bool](`document.querySelector('`+sel+`') !== null`))
	if err != nil {
		t.Fatal(err)
	}
	return ok
}

func overlap(a, b []int64) bool {
	seen := map[int64]bool{}
	for _, x := range a {
		seen[x] = true
	}
	for _, x := range b {
		if seen[x] {
			return true
		}
	}
	return false
}
