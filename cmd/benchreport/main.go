// Command benchreport measures every pglimit path beside its baselines in
// one run and writes BENCHMARKS.md with tables and an SVG chart.
//
//	go run ./cmd/benchreport                      # what `make bench` runs
//	go run ./cmd/benchreport -duration 500ms -rows 200000
//
// go test -bench gives a mean per operation; a limit's cost is better read
// as a latency distribution, so this command runs its own measured loops
// (package bench): for each path, at 1 and at 16 concurrent clients, each
// client runs the path's operation in a loop and every operation's latency
// is recorded; p50 and p99 are nearest-rank percentiles of all of them,
// ops/s is all operations over the wall time. Every path but the pages
// runs in -rounds interleaved rounds of -duration / -rounds, each round
// starting with another path, and keeps its median round.
// Each client warms up with one unrecorded operation. The paths are:
//
//   - baselines: SELECT 1 on the same pool (the floor of anything counted
//     in PostgreSQL), a one-row upsert (the floor of any counter kept in
//     PostgreSQL), an in-process semaphore (what one replica would use),
//     and go-redis/redis_rate Allow on the Redis at -redis (what a team
//     would pick instead; skipped, with a note, when it does not answer);
//   - pglimit: heavy claim+release, sign-in check, failure record, upload
//     claim, in-flight claim+release, the rate limit's decision under one
//     policy and under two, node limiter call — each through its package's
//     public API, nothing refused;
//   - pages: a 50-row page by keyset and by OFFSET at depths 0, 10k, 100k,
//     1M and 1.99M of a -rows table.
//
// The rate limit's decisions are then measured again beside redis_rate,
// SELECT 1 and the upsert in -rate-rounds interleaved rounds (each round
// runs each of them for half of -duration, starting with a different one
// each round), and the report gives the medians of the rounds: p50 at the
// lowest client count and throughput at the highest, as ratios.
//
// It also counts the heap allocations per request of each middleware on
// its path that never reaches the database, and of each database path with
// pgx's own allocations included, beside SELECT 1's.
//
// The database is DATABASE_URL (or -database-url), migrated with pglimit's
// schema, with a bench_event table made (or kept, when it has -rows rows);
// without one, a throwaway cluster from the installed PostgreSQL binaries,
// with fsync on.
package main

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"github.com/pglimit/pglimit"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/cmd/internal/bench"
	_ "github.com/pglimit/pglimit/cmd/internal/redisrate" // the redis_rate baseline
	"github.com/pglimit/pglimit/internal/harness/embedpg"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "benchreport:", err)
		os.Exit(1)
	}
}

// options are the command's flags.
type options struct {
	databaseURL string
	duration    time.Duration
	rounds      int
	clients     []int
	rows        int
	redis       string
	out, chart  string
	allocRuns   int
	rateRounds  int
}

func parse(args []string) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	fs.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL to measure on (default $DATABASE_URL, else a throwaway cluster)")
	fs.DurationVar(&o.duration, "duration", 2*time.Second, "measured time of each path at each client count")
	clients := fs.String("clients", "1,16", "client counts, comma-separated")
	fs.IntVar(&o.rows, "rows", bench.DefaultRows, "rows of the page fixture (0: no page paths)")
	fs.StringVar(&o.redis, "redis", "127.0.0.1:6379", "Redis of the redis_rate baseline (\"\": none)")
	fs.StringVar(&o.out, "out", "BENCHMARKS.md", "report to write")
	fs.StringVar(&o.chart, "chart", "docs/bench-latency.svg", "chart to write (linked from the report by its path relative to it)")
	fs.IntVar(&o.allocRuns, "alloc-runs", 1000, "runs of each allocation count")
	fs.IntVar(&o.rounds, "rounds", 3, "interleaved rounds of every path but the pages (each runs -duration / -rounds; the median round is kept)")
	fs.IntVar(&o.rateRounds, "rate-rounds", 5, "interleaved rounds of the rate limit's comparison with redis_rate (0: none)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	for _, c := range strings.Split(*clients, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(c))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-clients: %q is not a number from 1 to 256", c)
		}
		o.clients = append(o.clients, n)
	}
	switch {
	case o.duration <= 0 || o.duration > time.Minute:
		return nil, errors.New("-duration must be from 1ns to 1m")
	case o.rows != 0 && (o.rows < bench.PageSize || o.rows > 50_000_000):
		return nil, errors.New("-rows must be 0 or from 50 to 50,000,000")
	case o.allocRuns < 1:
		return nil, errors.New("-alloc-runs must be at least 1")
	case o.rounds < 1 || o.rounds > 100:
		return nil, errors.New("-rounds must be from 1 to 100")
	case o.rateRounds < 0 || o.rateRounds > 100:
		return nil, errors.New("-rate-rounds must be from 0 to 100")
	case o.out == "" || o.chart == "":
		return nil, errors.New("-out and -chart are required")
	}
	return o, nil
}

func run(args []string) error {
	o, err := parse(args)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := measure(ctx, o, os.Stderr)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(o.chart), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(o.chart, []byte(rep.SVG()), 0o644); err != nil {
		return err
	}
	rel, err := filepath.Rel(filepath.Dir(o.out), o.chart)
	if err != nil {
		rel = o.chart
	}
	if err := os.WriteFile(o.out, []byte(rep.Markdown(filepath.ToSlash(rel))), 0o644); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s and %s\n", o.out, o.chart)
	return nil
}

// measure runs everything and returns the report.
func measure(ctx context.Context, o *options, progress *os.File) (*Report, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(progress, "benchreport: "+format+"\n", args...) }
	rep := &Report{Started: time.Now(), Options: *o, Machine: machine(), LoadBefore: loadAvg()}
	url := o.databaseURL
	if url == "" {
		logf("no DATABASE_URL: starting a throwaway PostgreSQL (fsync on)")
		cluster, err := embedpg.Start(ctx, embedpg.Options{Settings: map[string]string{"fsync": "on", "full_page_writes": "on"}})
		if err != nil {
			return nil, err
		}
		defer func() { _ = cluster.Stop() }()
		url = cluster.URL("postgres")
		rep.Database = "throwaway cluster (internal/harness/embedpg) on loopback TCP, fsync on"
	} else {
		rep.Database = "DATABASE_URL"
	}
	maxConns := 8
	for _, c := range o.clients {
		maxConns = max(maxConns, c+4)
	}
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		return nil, err
	}
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&rep.PostgreSQL); err != nil {
		return nil, err
	}
	rep.PoolSize = maxConns
	if o.rows > 0 {
		start := time.Now()
		built, err := bench.BuildEvents(ctx, pool, o.rows)
		if err != nil {
			return nil, err
		}
		if built {
			logf("bench_event: %d rows built in %v", o.rows, time.Since(start).Round(time.Millisecond))
		}
	}
	suite, err := bench.NewSuite(ctx, pool, o.rows, o.redis)
	if err != nil {
		return nil, err
	}
	defer suite.Close()
	rep.Redis = suite.RedisNote
	pages, err := suite.Pages(ctx)
	if err != nil {
		return nil, err
	}
	requests, stopRequests, err := suite.Requests()
	if err != nil {
		return nil, err
	}
	defer stopRequests()
	calls, stopCalls, err := grpcPaths(pool)
	if err != nil {
		return nil, err
	}
	defer stopCalls()
	paths := append(append(append(append(suite.Baselines(), suite.Limits()...), pages...), requests...), calls...)
	rep.Paths = paths
	// Every path but the pages runs in -rounds interleaved rounds, each
	// starting with another path, so that what else the machine does falls
	// on all of them alike (a baseline measured in one quiet second and a
	// path in a busy one would make a false ratio); each path keeps the
	// round of its median p50. Pages, slow at depth, run once.
	var interleaved []bench.Path
	for _, p := range paths {
		if p.Kind != bench.Page {
			interleaved = append(interleaved, p)
		}
	}
	each := max(o.duration/time.Duration(o.rounds), time.Millisecond)
	for _, clients := range o.clients {
		rounds := map[string][]bench.Result{}
		for round := range o.rounds {
			for i := range interleaved {
				p := interleaved[(i+round)%len(interleaved)]
				r, err := bench.Measure(ctx, clients, each, 0, p.New)
				if err != nil {
					return nil, fmt.Errorf("%s at %d clients: %w", p.Name, clients, err)
				}
				rounds[p.Name] = append(rounds[p.Name], r)
			}
		}
		for _, p := range paths {
			var r bench.Result
			if p.Kind == bench.Page {
				var err error
				if r, err = bench.Measure(ctx, clients, o.duration, 0, p.New); err != nil {
					return nil, fmt.Errorf("%s at %d clients: %w", p.Name, clients, err)
				}
			} else {
				r = medianRound(rounds[p.Name])
			}
			logf("%-26s %3d clients  p50 %-10v p99 %-10v %9.0f ops/s  (%d ops)", p.Name, clients,
				r.P50.Round(time.Microsecond), r.P99.Round(time.Microsecond), r.Throughput(), r.Ops)
			rep.Results = append(rep.Results, Measured{Path: p, Result: r})
		}
	}

	if err := rateRounds(ctx, o, rep, append(suite.Baselines(), suite.Limits()...), logf); err != nil {
		return nil, err
	}

	cases, cleanup, err := bench.NoDBCases()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	for _, c := range cases {
		rep.NoDB = append(rep.NoDB, Allocs{Name: c.Name, What: c.What, PerOp: bench.AllocsPerRun(o.allocRuns, c.Run)})
	}
	for _, p := range append(suite.Baselines(), suite.Limits()...) {
		if p.Name == bench.NameSemaphore || p.Name == bench.NameNode {
			continue // no round trip: nothing to compare with SELECT 1
		}
		op, err := p.New(0)
		if err != nil {
			return nil, err
		}
		var opErr error
		n := bench.AllocsPerRun(max(o.allocRuns/5, 1), func() {
			if err := op(ctx); err != nil && opErr == nil {
				opErr = err
			}
		})
		if opErr != nil {
			return nil, fmt.Errorf("allocations of %s: %w", p.Name, opErr)
		}
		rep.WithDB = append(rep.WithDB, Allocs{Name: p.Name, What: p.What, PerOp: n})
	}
	rep.Finished = time.Now()
	rep.LoadAfter = loadAvg()
	return rep, nil
}

// RatePaths are the paths of the rate limit's comparison, in the order of
// its table: the baselines, then the decisions.
var RatePaths = []string{bench.NameRedisRate, bench.NameSelect1, bench.NameUpsert, bench.NameRateLimit, bench.NameRateLimit2}

// rateRounds measures the rate limit's decisions beside redis_rate, SELECT
// 1 and the one-row upsert again, in interleaved rounds: each round runs
// every one of them for a share of -duration, starting with a different
// one each round, so that what else the machine does falls on all of them
// alike; the report takes the median of the rounds.
func rateRounds(ctx context.Context, o *options, rep *Report, all []bench.Path, logf func(string, ...any)) error {
	if o.rateRounds == 0 {
		return nil
	}
	var paths []bench.Path
	for _, name := range RatePaths {
		for _, p := range all {
			if p.Name == name {
				paths = append(paths, p)
			}
		}
	}
	each := max(o.duration/2, time.Millisecond)
	for _, clients := range o.clients {
		for round := range o.rateRounds {
			for i := range paths {
				p := paths[(i+round)%len(paths)]
				r, err := bench.Measure(ctx, clients, each, 0, p.New)
				if err != nil {
					return fmt.Errorf("%s at %d clients: %w", p.Name, clients, err)
				}
				rep.RateRounds = append(rep.RateRounds, Measured{Path: p, Result: r})
			}
		}
		for _, p := range paths {
			if m, ok := rep.rateMedian(p.Name, clients); ok {
				logf("rate comparison: %-26s %3d clients  p50 %-10v %9.0f ops/s  (medians of %d rounds)", p.Name, clients,
					m.P50.Round(time.Microsecond), m.Ops, o.rateRounds)
			}
		}
	}
	return nil
}

// medianRound is the round whose p50 is the median of the rounds' (the
// lower middle one of an even number).
func medianRound(rs []bench.Result) bench.Result {
	sorted := slices.Clone(rs)
	slices.SortStableFunc(sorted, func(a, b bench.Result) int { return cmp.Compare(a.P50, b.P50) })
	return sorted[(len(sorted)-1)/2]
}

// machine describes the machine the run is on.
func machine() string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	mem := ""
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "MemTotal:" {
				if kb, err := strconv.Atoi(f[1]); err == nil {
					mem = fmt.Sprintf(", %.0f GiB RAM", float64(kb)/(1<<20))
				}
			}
		}
	}
	return fmt.Sprintf("%s, %d CPUs (GOMAXPROCS %d)%s, %s/%s, %s", model, runtime.NumCPU(), runtime.GOMAXPROCS(0), mem,
		runtime.GOOS, runtime.GOARCH, runtime.Version())
}

// loadAvg is the 1-minute load average, or "" where there is none: other
// work on the machine during the run shows in it.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return ""
}
