// Command scalecheck measures what pglimit costs its database, for the
// README's Scaling section and docs/scaling.md:
//
//	go run ./cmd/scalecheck -out docs/scaling.md -svg docs/scaling-churn.svg   # 2 min of operations, then 10 min of churn
//	go run ./cmd/scalecheck -op-duration 2s -duration 30s                       # a quick look
//
// # Operations per core-second
//
// Each operation of the limits — heavy claim + release, in-flight claim +
// release, sign-in check, failed sign-in, upload window claim, rate-limit
// decision — runs through the library's public API (heavy, inflight,
// signin, upload and ratelimit Acquire, Release, Fail) in loops of
// -clients clients for -op-duration, spread over -replicas pools (the
// stand-ins of a service's replicas, each with its own limiters). Each
// client is its own user, token or key, so nothing is refused: what is
// measured is the cost of a grant. Meanwhile the command counts the CPU
// time the database server spends, from /proc/<pid>/stat (utime + stime):
//
//   - on a throwaway cluster of its own (no -database-url), the whole
//     server — backends, WAL writer, checkpointer, autovacuum, the
//     postmaster and the children it reaped;
//   - on a server named by -database-url whose processes this machine can
//     see, the backends of the command's own connections (found in
//     pg_stat_activity by application_name).
//
// Operations divided by server CPU-seconds are the operations one core of
// PostgreSQL sustains. The figure does not depend on what else the machine
// runs (another process's CPU is not counted), unlike operations per
// second of wall time, which are reported beside it. When the server has
// pg_stat_statements loaded (the throwaway cluster does), the statements'
// execution time is reported as a cross-check.
//
// # Churn
//
// Then, for -duration, a mix of every operation runs at -rate operations
// per second from -workers loops over the same replicas, each running
// pglimit.Run (heartbeat and housekeeping every -housekeeping) as a
// service does: heavy and in-flight slots claimed, held up to 20 and 10 ms
// and released, upload slots and failed sign-ins kept for -window, rate
// rows lapsing a tenth of a second after their key's last request. Every
// -sample it records, for every table of pglimit, count(*), the live rows,
// pg_relation_size, pg_indexes_size, pg_total_relation_size,
// n_live_tup / n_dead_tup and the autovacuum runs (pg_stat_user_tables),
// with the claims' latency and the server CPU of the interval. When the
// load stops it waits for the windows to lapse, sweeps once, and samples
// the tables again: they must be empty.
//
// The report (-out, default standard output) is docs/scaling.md: the
// figures, the capacity they mean under stated assumptions, what a
// dedicated limits database costs and buys, and the limit tables on Citus.
// -svg writes the churn's chart. Progress goes to standard error. The
// command exits 1 when an operation failed or a limit table kept rows it
// should not have.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
)

func main() {
	code, err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "scalecheck:", err)
	}
	os.Exit(code)
}

// Config is one run.
type Config struct {
	// DatabaseURL is the server to measure; "" starts a throwaway cluster.
	DatabaseURL string
	// Clients are the numbers of concurrent clients each operation is
	// measured at.
	Clients []int
	// Replicas is the number of pools (replicas) the clients are spread
	// over; PoolConns the connections of each.
	Replicas, PoolConns int
	// OpDuration is how long each operation is measured at each number of
	// clients.
	OpDuration time.Duration
	// Duration is the churn's length (0: no churn); Sample the time between
	// two samples.
	Duration, Sample time.Duration
	// Rate is the churn's operations per second; Workers its loops.
	Rate    float64
	Workers int
	// Window is the churn's upload and sign-in window; Housekeeping the
	// replicas' sweep interval.
	Window, Housekeeping time.Duration
	// Out and SVG are the report's and the chart's files ("" standard
	// output; no chart).
	Out, SVG string
	// Citus measures the operations again on a throwaway Citus cluster (a
	// coordinator and two workers) after the one server's.
	Citus bool
}

// DefaultConfig is what the command runs without flags.
func DefaultConfig() Config {
	return Config{
		Clients: []int{1, 16}, Replicas: 2, PoolConns: 8,
		OpDuration: 10 * time.Second,
		Duration:   10 * time.Minute, Sample: 15 * time.Second,
		Rate: 500, Workers: 32,
		Window: time.Minute, Housekeeping: time.Minute,
	}
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) (int, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("scalecheck", flag.ContinueOnError)
	fs.SetOutput(stderr)
	clients := "1,16"
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "server to measure, migrated with pglimit's schema (default $DATABASE_URL, else a throwaway cluster: then the whole server's CPU is counted)")
	fs.StringVar(&clients, "clients", clients, "comma-separated numbers of concurrent clients each operation is measured at")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "pools (replicas, each with its own limiters) the clients and the churn are spread over")
	fs.IntVar(&cfg.PoolConns, "pool-conns", cfg.PoolConns, "connections of each replica's pool")
	fs.DurationVar(&cfg.OpDuration, "op-duration", cfg.OpDuration, "time each operation is measured at each number of clients")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the churn (0: none)")
	fs.DurationVar(&cfg.Sample, "sample", cfg.Sample, "time between two samples of the tables during the churn")
	fs.Float64Var(&cfg.Rate, "rate", cfg.Rate, "operations per second of the churn")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "loops of the churn")
	fs.DurationVar(&cfg.Window, "window", cfg.Window, "the churn's upload and sign-in window")
	fs.DurationVar(&cfg.Housekeeping, "housekeeping", cfg.Housekeeping, "each replica's housekeeping interval during the churn")
	fs.BoolVar(&cfg.Citus, "citus", false, "measure the operations again on a throwaway Citus cluster (a coordinator and two workers; Citus installed, ../shared/citus/build)")
	fs.StringVar(&cfg.Out, "out", "", "file of the report (default standard output)")
	fs.StringVar(&cfg.SVG, "svg", "", "file of the churn's chart, SVG (default none)")
	mix := mixConfig{Replicas: 4, Users: 8000, Warmup: 3 * time.Minute, Duration: 2 * time.Minute, MaxRequest: 2 * time.Minute, Kill: true, Pushers: true}
	var mixName string
	fs.StringVar(&mixName, "mix", "", "instead of the operations, run a client mix and print what the limits cost per request: cold (the reference service's limits at its default flags, through the library, for users who each send a request every 10 s to the next replica in turn; see mix.go)")
	fs.IntVar(&mix.Users, "users", mix.Users, "-mix: users, each a request every 10 s (8,000 make 800 requests a second)")
	fs.Float64Var(&mix.Steady, "steady", mix.Steady, "-mix: the share of the requests from steady clients (sticky, a request every 20 ms), 0 to 1")
	fs.DurationVar(&mix.Warmup, "warmup", mix.Warmup, "-mix: load before the measure (the in-flight shares spend MaxDuration + 35 s after their claim)")
	fs.DurationVar(&mix.Duration, "mix-duration", mix.Duration, "-mix: the measured load")
	fs.DurationVar(&mix.MaxRequest, "max-request", mix.MaxRequest, "-mix: the in-flight cap's MaxDuration (cmd/studio's -max-request-time)")
	fs.BoolVar(&mix.JSON, "json", false, "-mix: print the result as one JSON object")
	fs.BoolVar(&mix.Pushers, "pushers", mix.Pushers, "-mix: run the clients that push each limit (a user at 150 % of the rate over every replica, one at 90 % on one; a token at 150 % of the in-flight cap, one at 90 %)")
	fs.BoolVar(&mix.Kill, "mix-kill", mix.Kill, "-mix: kill a replica a third into the measure and start another half way")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, err
		}
		return 2, err
	}
	if fs.NArg() > 0 {
		return 2, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	var err error
	if cfg.Clients, err = parseClients(clients); err != nil {
		return 2, err
	}
	if err := cfg.check(); err != nil {
		return 2, err
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	if mixName != "" {
		if mixName != "cold" {
			return 2, fmt.Errorf("-mix %q: the mix is cold", mixName)
		}
		fs.Visit(func(f *flag.Flag) {
			if f.Name == "replicas" {
				mix.Replicas = cfg.Replicas
			}
		})
		if mix.Users < 1 || mix.Steady < 0 || mix.Steady > 1 || mix.Duration < 3*time.Second || mix.Warmup < 0 {
			return 2, errors.New("-mix: -users at least 1, -steady 0 to 1, -mix-duration at least 3s, -warmup not negative")
		}
		return runMix(ctx, mix, stdout, stderr)
	}
	rep, err := Measure(ctx, cfg, stderr)
	if err != nil {
		return 2, err
	}
	var md bytes.Buffer
	if err := rep.Markdown(&md); err != nil {
		return 2, err
	}
	if cfg.Out == "" {
		_, err = stdout.Write(md.Bytes())
	} else {
		err = os.WriteFile(cfg.Out, md.Bytes(), 0o644)
	}
	if err != nil {
		return 2, err
	}
	if cfg.SVG != "" && rep.Churn != nil {
		if err := os.WriteFile(cfg.SVG, []byte(rep.Chart()), 0o644); err != nil {
			return 2, err
		}
	}
	if problems := rep.Problems(); len(problems) > 0 {
		for _, p := range problems {
			fmt.Fprintln(stderr, "scalecheck: FAILED:", p)
		}
		return 1, nil
	}
	return 0, nil
}

func parseClients(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 || n > 256 {
			return nil, fmt.Errorf("-clients: %q is not a number of clients from 1 to 256", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func (c Config) check() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 16:
		return errors.New("-replicas: 1 to 16")
	case c.PoolConns < 1 || c.PoolConns > 100:
		return errors.New("-pool-conns: 1 to 100")
	case c.OpDuration < 100*time.Millisecond || c.OpDuration > 10*time.Minute:
		return errors.New("-op-duration: 100ms to 10m")
	case c.Duration < 0 || c.Duration > 24*time.Hour:
		return errors.New("-duration: 0 to 24h")
	case c.Duration > 0 && (c.Sample < 100*time.Millisecond || c.Sample > c.Duration):
		return errors.New("-sample: from 100ms to -duration")
	case c.Rate <= 0 || c.Rate > 100000:
		return errors.New("-rate: above 0, at most 100000")
	case c.Workers < 1 || c.Workers > 1000:
		return errors.New("-workers: 1 to 1000")
	case c.Window < time.Second || c.Window > time.Hour:
		return errors.New("-window: 1s to 1h")
	case c.Housekeeping < 10*time.Millisecond:
		return errors.New("-housekeeping: at least 10ms")
	}
	return nil
}

// env is what a run measures with.
type env struct {
	cfg Config
	url string
	// replicaURLs, when set, are the nodes the replicas' pools connect
	// to, replica i to replicaURLs[i % len]: on Citus, the workers.
	replicaURLs []string
	appName     string
	observer    *pgxpool.Pool
	pools       []*pgxpool.Pool
	cpu         *cpuMeter
	run         string
	quiet       *slog.Logger
	statements  bool
	progress    io.Writer

	errMu  sync.Mutex
	errors map[string]string // the first error of each operation
}

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.progress, "scalecheck: "+format+"\n", args...)
}

func (e *env) noteError(op string, err error) {
	e.errMu.Lock()
	defer e.errMu.Unlock()
	if _, ok := e.errors[op]; !ok {
		e.errors[op] = err.Error()
	}
}

// Measure runs the operations and the churn and returns the report.
func Measure(ctx context.Context, cfg Config, progress io.Writer) (*Report, error) {
	e := &env{
		cfg: cfg, progress: progress, errors: map[string]string{},
		run:   strconv.FormatInt(time.Now().UnixNano()%1e9, 36),
		quiet: slog.New(slog.NewTextHandler(io.Discard, nil)),
	}
	rep := &Report{Config: cfg, Started: time.Now().UTC(), CPUs: runtime.NumCPU(), LoadStart: loadAverage()}
	url, whole := cfg.DatabaseURL, false
	if url == "" {
		e.logf("no -database-url: starting a throwaway PostgreSQL (fsync on, pg_stat_statements loaded)")
		cluster, err := embedpg.Start(ctx, embedpg.Options{Settings: map[string]string{
			"fsync": "on", "full_page_writes": "on",
			"shared_preload_libraries": "pg_stat_statements",
		}})
		if err != nil {
			return nil, fmt.Errorf("throwaway PostgreSQL: %w", err)
		}
		defer func() { _ = cluster.Stop() }()
		url, whole = cluster.URL("postgres"), true
		rep.Server = "throwaway cluster (internal/harness/embedpg) on loopback TCP, fsync on, autovacuum on with PostgreSQL's defaults"
	} else {
		rep.Server = "the server of -database-url"
	}
	e.url, e.appName = url, "scalecheck-"+e.run
	// The observer's connection reads the statistics, the CPU and the
	// tables; it is not one of the replicas (its backend is not counted
	// as theirs).
	oc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	oc.MaxConns = 2
	oc.ConnConfig.RuntimeParams["application_name"] = e.appName + "-observer"
	if e.observer, err = pgxpool.NewWithConfig(ctx, oc); err != nil {
		return nil, err
	}
	defer e.observer.Close()
	if err := pglimit.Migrate(ctx, e.observer); err != nil {
		return nil, fmt.Errorf("migrate: %w", err)
	}
	if err := e.observer.QueryRow(ctx, "SHOW server_version").Scan(&rep.Version); err != nil {
		return nil, err
	}
	if e.cpu, err = newCPUMeter(ctx, e.observer, e.appName, whole); err != nil {
		return nil, err
	}
	if whole {
		rep.CPUSource = "the whole server: every process of the cluster (backends, WAL writer, checkpointer, autovacuum, the postmaster and the children it reaped)"
	} else {
		rep.CPUSource = "the run's own backends (found in pg_stat_activity by application_name): the WAL writer and autovacuum are not counted"
	}
	e.statements = e.setupStatements(ctx)

	if err := e.openPools(ctx); err != nil {
		return nil, err
	}
	if rep.Ops, err = e.throughput(ctx); err != nil {
		e.closePools()
		return nil, err
	}
	if cfg.Citus {
		if rep.Citus, err = e.onCitus(ctx); err != nil {
			e.closePools()
			return nil, err
		}
	}
	if cfg.Duration > 0 {
		// The churn's replicas are new ones: the throughput phase's
		// backends end (and report their statistics) before the tables
		// are emptied, so the churn starts from empty tables with no dead
		// rows counted.
		e.closePools()
		if err := e.openPools(ctx); err != nil {
			return nil, err
		}
		if rep.Churn, err = e.churn(ctx); err != nil {
			e.closePools()
			return nil, err
		}
	}
	e.closePools()
	rep.LoadEnd = loadAverage()
	rep.Errors = e.errors
	rep.Wall = time.Since(rep.Started)
	return rep, nil
}

// openPools opens the replicas' pools, every connection open.
func (e *env) openPools(ctx context.Context) error {
	for i := 0; i < e.cfg.Replicas; i++ {
		url := e.url
		if len(e.replicaURLs) > 0 {
			url = e.replicaURLs[i%len(e.replicaURLs)]
		}
		pc, err := pgxpool.ParseConfig(url)
		if err != nil {
			return err
		}
		pc.MaxConns, pc.MinConns = int32(e.cfg.PoolConns), int32(e.cfg.PoolConns)
		pc.ConnConfig.RuntimeParams["application_name"] = e.appName
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return err
		}
		e.pools = append(e.pools, pool)
		if err := warm(ctx, pool, e.cfg.PoolConns); err != nil {
			return err
		}
	}
	return nil
}

// closePools closes the replicas' pools.
func (e *env) closePools() {
	for _, p := range e.pools {
		p.Close()
	}
	e.pools = nil
}

// warm opens every connection of the pool, so the measured phases start
// with their backends running (their CPU counted from the first reading).
func warm(ctx context.Context, pool *pgxpool.Pool, n int) error {
	var conns []*pgxpool.Conn
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for i := 0; i < n; i++ {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// setupStatements makes pg_stat_statements usable when the server has it
// loaded and the role may reset it; it reports whether it is.
func (e *env) setupStatements(ctx context.Context) bool {
	if _, err := e.observer.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return false
	}
	return e.resetStatements(ctx)
}

func (e *env) resetStatements(ctx context.Context) bool {
	_, err := e.observer.Exec(ctx, "SELECT pg_stat_statements_reset()")
	return err == nil
}

// statementTime is the execution time and calls of the run's statements
// since the last reset (the observer's own statements left out).
func (e *env) statementTime(ctx context.Context) (time.Duration, int64) {
	var ms float64
	var calls int64
	err := e.observer.QueryRow(ctx, `
SELECT coalesce(sum(total_exec_time), 0), coalesce(sum(calls), 0)::bigint
FROM pg_stat_statements
WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND query !~* 'pg_stat_|pg_backend_pid'`).Scan(&ms, &calls)
	if err != nil {
		return -1, 0
	}
	return time.Duration(ms * float64(time.Millisecond)), calls
}

// loadAverage is the machine's 1-, 5- and 15-minute load averages.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
