package main

import (
	"encoding/xml"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/bench"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestReport runs the whole command briefly on a small fixture and checks
// what it writes: a table row for every path at each client count with a
// ratio to SELECT 1, the page table, both allocation tables, and a chart
// that is well-formed SVG with a bar per path and client count.
func TestReport(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	out, chart := filepath.Join(dir, "BENCHMARKS.md"), filepath.Join(dir, "docs", "bench.svg")
	err := run([]string{"-database-url", pgtest.URL(t), "-duration", "30ms", "-rows", "12000", "-clients", "1,4",
		"-alloc-runs", "20", "-rate-rounds", "2", "-out", out, "-chart", chart})
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| *SELECT 1 (floor)* | 1 |", "| *in-process semaphore* | 4 |",
		"| heavy claim+release | 1 |", "| sign-in check | 4 |", "| failure record | 1 |", "| upload claim | 4 |",
		"| in-flight claim+release | 1 |", "| node limiter call | 4 |",
		"| *one-row upsert (floor)* | 1 |", "| rate limit decision | 4 |", "| rate limit, two policies | 1 |",
		"## The rate limit beside redis_rate", "| path | p50, 1 client(s) | ÷ redis_rate | ÷ SELECT 1 | ÷ upsert | ops/s, 4 clients |",
		"| 0 | 1 |", "| 10,000 | 4 |", // page depths that fit in 12,000 rows
		"| heavy: unidentified (passes) |", "| inflight: unidentified (passes) |", "| signin: unidentified (400) |", "| cursor: parse + next |",
		"![p50 and p99 latency", "(docs/bench.svg)", "**Machine:**",
		"## The gRPC call", "| gRPC call alone | 1 |", "| gRPC call, rate limit | 4 |", "| gRPC call, in-flight cap | 1 |",
	} {
		if !strings.Contains(string(md), want) {
			t.Errorf("report without %q", want)
		}
	}
	svg, err := os.ReadFile(chart)
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		XMLName xml.Name
		Rects   []struct {
			Title string `xml:"title"`
		} `xml:"rect"`
	}
	if err := xml.Unmarshal(svg, &doc); err != nil || doc.XMLName.Local != "svg" {
		t.Fatalf("chart is not SVG: %v", err)
	}
	bars := 0
	for _, r := range doc.Rects {
		if strings.Contains(r.Title, "p50") {
			bars++
		}
	}
	// 9 paths (redis_rate only when Redis answers) + 4 page paths, at 2 client counts.
	if bars < 2*(8+4) {
		t.Errorf("%d bars in the chart", bars)
	}
}

func TestFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-clients", "0"}, {"-clients", "1,x"}, {"-duration", "0s"}, {"-duration", "2m"},
		{"-rows", "10"}, {"-alloc-runs", "0"}, {"-rate-rounds", "-1"}, {"-rounds", "0"}, {"-rounds", "101"}, {"-out", ""}, {"extra"},
	} {
		if _, err := parse(args); err == nil {
			t.Errorf("%v accepted", args)
		}
	}
	o, err := parse([]string{"-clients", "2, 8", "-duration", "1s"})
	if err != nil || len(o.clients) != 2 || o.clients[1] != 8 || o.duration != time.Second {
		t.Fatalf("%+v %v", o, err)
	}
}

func TestFormat(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{90, "90 ns"}, {1500, "1.50 µs"}, {61 * time.Microsecond, "61 µs"}, {1730 * time.Microsecond, "1.73 ms"},
		{47 * time.Millisecond, "47.0 ms"}, {2 * time.Second, "2.00 s"},
	} {
		if got := formatDur(tc.d); got != tc.want {
			t.Errorf("formatDur(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
	for x, want := range map[float64]string{1: "1.00×", 15.2: "15.2×", 103: "103×", 0.0008: "0.0008×"} {
		if got := formatRatio(x); got != want {
			t.Errorf("formatRatio(%v) = %q, want %q", x, got, want)
		}
	}
	for e, want := range map[int]string{1: "10 ns", 3: "1 µs", 8: "100 ms", 10: "10 s", 11: "100 s"} {
		if got := decade(e); got != want {
			t.Errorf("decade(%d) = %q, want %q", e, got, want)
		}
	}
	if groupDigits(2000000) != "2,000,000" || groupDigits(0) != "0" {
		t.Error("groupDigits")
	}
}

func TestMedianRound(t *testing.T) {
	t.Parallel()
	r := func(p50 time.Duration, ops int) bench.Result { return bench.Result{P50: p50, Ops: ops} }
	for _, tc := range []struct {
		in   []bench.Result
		want int // Ops of the round kept
	}{
		{[]bench.Result{r(5, 1)}, 1},
		{[]bench.Result{r(9, 1), r(3, 2), r(5, 3)}, 3},
		{[]bench.Result{r(9, 1), r(3, 2), r(5, 3), r(4, 4)}, 4},
		{[]bench.Result{r(2, 1), r(2, 2)}, 1},
	} {
		if got := medianRound(tc.in); got.Ops != tc.want {
			t.Errorf("medianRound(%v) kept the round of %d ops, want %d", tc.in, got.Ops, tc.want)
		}
	}
}
