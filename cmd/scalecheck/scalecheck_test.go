package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/citustest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestShortRun runs the whole command for a few seconds against a test
// database, so that it cannot rot: every operation completes without an
// error or a refusal, the server's CPU is counted, every limit table's size
// is sampled, the tables never hold more permit rows than the loops can
// hold slots, and after the windows lapse and one sweep they hold none.
// Nothing here judges a time.
func TestShortRun(t *testing.T) {
	dir := t.TempDir()
	cfg := DefaultConfig()
	cfg.DatabaseURL = pgtest.URL(t, pgtest.Limits())
	cfg.Clients = []int{1, 3}
	cfg.OpDuration = 300 * time.Millisecond
	cfg.Duration, cfg.Sample = 3*time.Second, time.Second
	cfg.Rate, cfg.Workers = 200, 8
	cfg.Window, cfg.Housekeeping = time.Second, 500*time.Millisecond
	cfg.Out, cfg.SVG = filepath.Join(dir, "scaling.md"), filepath.Join(dir, "churn.svg")

	rep := measure(t, cfg)

	if got, want := len(rep.Ops), len(Operations)*len(cfg.Clients); got != want {
		t.Fatalf("%d results, want %d (every operation at every number of clients)", got, want)
	}
	var cpu time.Duration
	for _, o := range rep.Ops {
		if o.Ops == 0 || o.Errors != 0 || o.Refused != 0 {
			t.Errorf("%s at %d clients: %d operations, %d errors, %d refused; want some, none, none", o.Name, o.Clients, o.Ops, o.Errors, o.Refused)
		}
		if o.Replicas != min(o.Clients, cfg.Replicas) {
			t.Errorf("%s at %d clients: spread over %d replicas, want %d", o.Name, o.Clients, o.Replicas, min(o.Clients, cfg.Replicas))
		}
		cpu += o.ServerCPU()
	}
	if cpu <= 0 {
		t.Errorf("no server CPU counted over %d operations", len(rep.Ops))
	}

	c := rep.Churn
	if c == nil {
		t.Fatal("no churn in the report")
	}
	if c.Ops == 0 || c.Errors != 0 {
		t.Errorf("churn: %d operations, %d errors; want some and none", c.Ops, c.Errors)
	}
	load := c.Load()
	if len(load) < 2 {
		t.Fatalf("churn: %d samples under load, want at least 2", len(load))
	}
	for _, s := range c.Samples {
		if len(s.Tables) != len(limitTables) {
			t.Fatalf("sample at %v: %d tables, want %d", s.At, len(s.Tables), len(limitTables))
		}
		for _, tb := range s.Tables {
			if tb.TotalBytes <= 0 || tb.TotalBytes < tb.TableBytes+tb.IndexBytes {
				t.Errorf("sample at %v: %s sizes table %d, indexes %d, total %d", s.At, tb.Name, tb.TableBytes, tb.IndexBytes, tb.TotalBytes)
			}
		}
		heavy, flight := s.Held["heavy_permit"], s.Held["request_in_flight"]
		if heavy > int64(2*cfg.Workers) || flight > int64(cfg.Workers) {
			t.Errorf("sample at %v: heavy_permit %d live slots, request_in_flight %d; the %d loops hold at most %d and %d", s.At, heavy, flight, cfg.Workers, 2*cfg.Workers, cfg.Workers)
		}
	}
	final := c.Final()
	if !final.Final {
		t.Fatal("no sample after the sweep")
	}
	for _, tb := range final.Tables {
		if tb.Name != "refusal_minute" && tb.Rows != 0 {
			t.Errorf("after the windows and a sweep, %s holds %d rows, want 0", tb.Name, tb.Rows)
		}
	}
	// Rows were written during the churn: the emptiness after the sweep is
	// housekeeping's and the releases' doing, not a load that wrote nothing.
	for _, s := range c.Summaries() {
		switch s.Name {
		case "slot", "login_attempt", "api_request_window":
			if s.MaxRows == 0 {
				t.Errorf("%s never held a row during the churn", s.Name)
			}
		}
	}

	var md bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		t.Fatalf("Markdown: %v", err)
	}
	for _, want := range append([]string{"## 1. What one PostgreSQL core sustains", "## 2. The limit tables over a long run",
		"## 3. A dedicated limits database", "## 4. Beyond one primary", "churn.svg", "no value>"}, Operations...) {
		if want == "no value>" {
			if strings.Contains(md.String(), want) {
				t.Errorf("the report holds a missing value (%q)", want)
			}
			continue
		}
		if !strings.Contains(md.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	// Kept slots: a steady token's requests are decided from memory, so
	// the report gives the requests a core decides with them, and where
	// the server counts statements, far fewer than the two of a claim and
	// a release per request.
	capa := rep.Capacity(DefaultAssumptions)
	if capa.RequestsKept <= 0 || !strings.Contains(md.String(), "With kept slots as well") {
		t.Errorf("no figure with kept slots: %v requests a second, report section present %v",
			capa.RequestsKept, strings.Contains(md.String(), "With kept slots as well"))
	}
	if capa.KeptStatements > 0.5 {
		t.Errorf("kept slots: %.3f statements per request, want far fewer than a claim and a release", capa.KeptStatements)
	}
	t.Logf("kept slots: %.4f statements per request (-1: not counted), %v of server CPU", capa.KeptStatements, capa.KeptServer)
	if svg := rep.Chart(); !strings.Contains(svg, "<polyline") || !strings.HasSuffix(svg, "</svg>\n") {
		t.Errorf("the chart has no line, or is not closed:\n%.300s", svg)
	}
}

// measure runs cfg and fails t on an error or a problem of the report; it
// skips t where the server's processes cannot be read.
func measure(t *testing.T, cfg Config) *Report {
	t.Helper()
	var progress bytes.Buffer
	rep, err := Measure(context.Background(), cfg, &progress)
	if errors.Is(err, errNoProc) {
		t.Skipf("the server's processes are not visible here: %v", err)
	}
	if err != nil {
		t.Fatalf("Measure: %v\nprogress:\n%s", err, progress.String())
	}
	if problems := rep.Problems(); len(problems) > 0 {
		t.Errorf("problems:\n%s", strings.Join(problems, "\n"))
	}
	return rep
}

// TestCitusRun measures the operations on a Citus cluster (-citus) for a
// moment: every operation completes there without an error or a refusal,
// the CPU of the coordinator and of both workers is counted, and the report
// gives the Citus figures beside the one server's.
func TestCitusRun(t *testing.T) {
	if ok, line := citustest.Installed(); !ok {
		t.Skip(line)
	}
	if testing.Short() {
		t.Skip("a Citus cluster of three servers")
	}
	cfg := DefaultConfig()
	cfg.DatabaseURL = pgtest.URL(t, pgtest.Limits())
	cfg.Clients = []int{1, 3}
	cfg.OpDuration = 300 * time.Millisecond
	cfg.Duration = 0
	cfg.Citus = true
	rep := measure(t, cfg)
	if rep.Citus == nil || len(rep.Citus.Ops) != len(Operations)*len(cfg.Clients) || rep.Citus.Workers != 2 {
		t.Fatalf("the Citus run: %+v, want every operation at every number of clients on two workers", rep.Citus)
	}
	// A node's CPU is counted by the kernel in clock ticks (10 ms), which
	// a handful of operations do not fill: 5 in 300 ms beside other tests
	// on a loaded machine counted 0 on the workers. A zero is a failure to
	// count only past 200 operations (tens of milliseconds of CPU).
	countable := func(o OpResult) bool { return o.Ops >= 200 }
	for _, o := range rep.Citus.Ops {
		if o.Ops == 0 || o.Errors != 0 || o.Refused != 0 {
			t.Errorf("on citus, %s at %d clients: %d operations, %d errors, %d refused; want some, none, none", o.Name, o.Clients, o.Ops, o.Errors, o.Refused)
		}
		if len(o.CPU.Nodes) != 3 {
			t.Fatalf("on citus, %s: CPU of %d nodes, want the coordinator's and two workers'", o.Name, len(o.CPU.Nodes))
		}
		if o.Name != OpRateBorrowed && o.Name != OpInflightKept && countable(o) && (o.NodePerOp(0) <= 0 || o.WorkersPerOp() <= 0) {
			t.Errorf("on citus, %s: coordinator %v and workers %v per op, want both counted", o.Name, o.NodePerOp(0), o.WorkersPerOp())
		}
	}
	// Sent to the workers: every operation but those that need the
	// coordinator's bus, each node's CPU counted, the coordinator's
	// next to nothing (the replicas do not reach it).
	if want := len(Operations) - 2; len(rep.Citus.OnWorkers) != want*len(cfg.Clients) {
		t.Fatalf("sent to the workers: %d results, want %d operations at each of %v clients", len(rep.Citus.OnWorkers), want, cfg.Clients)
	}
	for _, o := range rep.Citus.OnWorkers {
		if o.Ops == 0 || o.Errors != 0 || o.Refused != 0 || len(o.CPU.Nodes) != 3 || countable(o) && o.WorkersPerOp() <= 0 {
			t.Errorf("sent to the workers, %s at %d clients: %d operations, %d errors, %d refused, %d nodes' CPU, workers %v per op",
				o.Name, o.Clients, o.Ops, o.Errors, o.Refused, len(o.CPU.Nodes), o.WorkersPerOp())
		}
	}
	var md bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		t.Fatalf("Markdown: %v", err)
	}
	for _, want := range []string{"### What a decision costs on Citus", "### How decisions per second grow with workers", "-citus -out",
		"Citus sent to the workers: every node's CPU per op"} {
		if !strings.Contains(md.String(), want) {
			t.Errorf("the report lacks %q", want)
		}
	}
	if strings.Contains(md.String(), "no value>") {
		t.Error("the report holds a missing value")
	}
}

// TestProblems: the checks that fail the command see leftover rows, rows
// over what the loops can hold, failures and refusals.
func TestProblems(t *testing.T) {
	sample := func(final bool, heavy, flight, upload int64) Sample {
		var out []TableSample
		for _, n := range limitTables {
			ts := TableSample{Name: n, TotalBytes: 8192}
			switch n {
			case "slot":
				ts.Rows = heavy + flight + upload
			case "refusal_minute":
				ts.Rows = 3 // kept an hour: never a problem
			}
			out = append(out, ts)
		}
		return Sample{Final: final, Tables: out,
			Held: map[string]int64{"heavy_permit": heavy, "request_in_flight": flight, "upload_window": upload}}
	}
	ok := OpResult{Name: OpHeavy, Clients: 1, Ops: 10}
	for _, tc := range []struct {
		name    string
		ops     []OpResult
		samples []Sample
		want    string
	}{
		{"clean", []OpResult{ok}, []Sample{sample(false, 4, 2, 9), sample(true, 0, 0, 0)}, ""},
		{"errors", []OpResult{{Name: OpRate, Clients: 1, Ops: 5, Errors: 1}}, nil, "operations failed"},
		{"refusals", []OpResult{{Name: OpRate, Clients: 1, Ops: 5, Refused: 2}}, nil, "refused"},
		{"nothing done", []OpResult{{Name: OpRate, Clients: 1}}, nil, "no operation completed"},
		{"heavy rows over the loops", []OpResult{ok}, []Sample{sample(false, 9, 0, 0)}, "heavy_permit holds 9 live slots"},
		{"in-flight rows over the loops", []OpResult{ok}, []Sample{sample(false, 0, 5, 0)}, "request_in_flight holds 5 live slots"},
		{"left after the sweep", []OpResult{ok}, []Sample{sample(true, 0, 0, 1)}, "slot still holds 1 rows"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &Report{Config: Config{Workers: 4}, Ops: tc.ops, Errors: map[string]string{}}
			if tc.samples != nil {
				r.Churn = &Churn{Samples: tc.samples}
			}
			got := strings.Join(r.Problems(), "\n")
			if (tc.want == "") != (got == "") || !strings.Contains(got, tc.want) {
				t.Errorf("Problems() = %q, want one containing %q", got, tc.want)
			}
		})
	}
}

// TestFlags: bad flags are refused before anything starts (exit 2).
func TestFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-clients", "0"},
		{"-clients", "1,x"},
		{"-replicas", "0"},
		{"-rate", "0"},
		{"-workers", "0"},
		{"-op-duration", "1ms"},
		{"-window", "10ms"},
		{"-duration", "2s", "-sample", "3s"},
		{"-duration", "-1s"},
		{"extra"},
		{"-no-such-flag"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			code, err := run(context.Background(), args, io.Discard, io.Discard)
			if code != 2 || err == nil {
				t.Errorf("run(%q) = %d, %v; want 2 and an error", args, code, err)
			}
		})
	}
}

// TestReadProc reads this process's own /proc entry.
func TestReadProc(t *testing.T) {
	p, err := readProc(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if p.ppid != os.Getppid() {
		t.Errorf("ppid %d, want %d", p.ppid, os.Getppid())
	}
	// Burn some CPU so the kernel has ticks to report.
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	if p2, _ := readProc(os.Getpid()); p2.own <= 0 {
		t.Errorf("own CPU %v after running, want more than 0", p2.own)
	}
	if _, err := readProc(1 << 30); err == nil {
		t.Error("readProc of a pid that does not exist: no error")
	}
}

// TestCapacityFromMemory: a borrowed decision and a kept request can send
// no statement at all in a short measurement on a loaded machine, so
// their server CPU counts 0; the figures with them are still given (the
// loaded CI run once had neither), and the report words them without a
// missing value.
func TestCapacityFromMemory(t *testing.T) {
	op := func(name string, ops int64, server time.Duration) OpResult {
		return OpResult{Name: name, Clients: 1, Replicas: 1, Ops: ops, Wall: time.Second, P50: time.Millisecond,
			P99: time.Millisecond, CPU: cpuUsed{Server: server}, StatementTime: -1}
	}
	rep := &Report{Ops: []OpResult{
		op(OpHeavy, 100, 30*time.Millisecond), op(OpInflight, 100, 27*time.Millisecond),
		op(OpCheck, 100, 5*time.Millisecond), op(OpFailure, 100, 18*time.Millisecond),
		op(OpUpload, 100, 14*time.Millisecond), op(OpRate, 100, 14*time.Millisecond),
		op(OpRateBorrowed, 5000, 0), op(OpInflightKept, 300, 0),
	}}
	c := rep.Capacity(DefaultAssumptions)
	if c.RequestsBorrowed <= c.Requests || c.RequestsKept <= c.RequestsBorrowed {
		t.Errorf("requests a core: %.0f, borrowing %.0f, kept %.0f; want each more than the one before",
			c.Requests, c.RequestsBorrowed, c.RequestsKept)
	}
	if c.KeptServer != 0 || c.KeptStatements != -1 {
		t.Errorf("kept: %v of server CPU, %.2f statements (-1: not counted)", c.KeptServer, c.KeptStatements)
	}
	// Without a measurement of the borrowed decision there is no figure
	// with it, rather than a made-up one.
	rep.Ops = slices.DeleteFunc(slices.Clone(rep.Ops), func(o OpResult) bool { return o.Name == OpRateBorrowed })
	if c := rep.Capacity(DefaultAssumptions); c.RequestsBorrowed != 0 || c.RequestsKept != 0 {
		t.Errorf("with no borrowed decision measured: borrowing %.0f, kept %.0f; want none", c.RequestsBorrowed, c.RequestsKept)
	}
}
