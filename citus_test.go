package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/harness/citustest"
	"github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/middleware/signin"
)

// statementLog records every statement a pool runs, with its arguments.
type statementLog struct {
	mu    sync.Mutex
	calls []statementCall
}

type statementCall struct {
	name, sql string
	args      []any
}

func (s *statementLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := ""
	if rest, ok := strings.CutPrefix(d.SQL, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	}
	s.mu.Lock()
	s.calls = append(s.calls, statementCall{name: name, sql: d.SQL, args: d.Args})
	s.mu.Unlock()
	return ctx
}

func (s *statementLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// byName returns the first call of every named statement.
func (s *statementLog) byName() map[string]statementCall {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]statementCall{}
	for _, c := range s.calls {
		if _, ok := out[c.name]; !ok && c.name != "" {
			out[c.name] = c
		}
	}
	return out
}

// TestOnCitus: pglimit.Migrate on a Citus coordinator (two workers)
// distributes the limit tables, colocated, by the column each decision
// names, keeps their shards UNLOGGED and leaves the small tables on the
// coordinator; the sign-in throttle works there as on one server (reset
// and the refusal answered from memory included); and every statement its
// decisions make is a router statement — one task, on the shard of its
// key — by Citus' own plan (EXPLAIN on a fresh session). The rate limit's
// decisions and the slot claims are not yet router statements on Citus
// (issue 21): the test lists them as they are, and fails when the
// statements it holds to the router rule are not.
func TestOnCitus(t *testing.T) {
	if ok, line := citustest.Installed(); !ok {
		t.Skip(line)
	}
	if testing.Short() {
		t.Skip("a Citus cluster of three servers")
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cluster, err := citustest.Start(ctx, citustest.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cluster.Stop() })
	url := cluster.URL("postgres")

	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	log := &statementLog{}
	cfg.ConnConfig.Tracer = log
	cfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil { // a second replica, or a restart
		t.Fatalf("Migrate again: %v", err)
	}

	// The placement, by Citus' catalog.
	rows, err := pool.Query(ctx, `SELECT logicalrelid::text, column_to_column_name(logicalrelid, partkey), colocationid
		FROM pg_dist_partition WHERE logicalrelid::text LIKE 'pglimit.%' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	placed := map[string]string{}
	colocation := map[int64]bool{}
	for rows.Next() {
		var table, column string
		var group int64
		if err := rows.Scan(&table, &column, &group); err != nil {
			t.Fatal(err)
		}
		placed[table] = column
		colocation[group] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"pglimit.slot": "scope", "pglimit.login_attempt": "key", "pglimit.api_request_window": "key"}
	if fmt.Sprint(placed) != fmt.Sprint(want) || len(colocation) != 1 {
		t.Fatalf("distributed: %v in %d colocation groups; want %v, colocated", placed, len(colocation), want)
	}
	for _, w := range cluster.WorkerURLs("postgres") {
		var logged int
		if err := pgxQueryRow(ctx, w, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
			WHERE n.nspname = 'pglimit' AND c.relkind = 'r' AND c.relname ~ '^(slot|login_attempt|api_request_window)_[0-9]+$'
			AND c.relpersistence <> 'u'`, &logged); err != nil {
			t.Fatal(err)
		}
		if logged != 0 {
			t.Fatalf("a worker holds %d logged shards of the limit tables, want none", logged)
		}
	}

	// The sign-in throttle on the coordinator, its bus included.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	runCtx, stopRun := context.WithCancel(ctx)
	runDone := make(chan error, 1)
	go func() { runDone <- pglimit.Run(runCtx, pool, pglimit.RunOptions{Logger: quiet}) }()
	defer func() { stopRun(); <-runDone }()
	throttle, err := signin.New(pool, signin.Options{Limit: 2, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	lenient, err := signin.New(pool, signin.Options{Limit: 2, Lenient: true, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		p, err := throttle.Acquire(ctx, "username:eve")
		if err != nil {
			t.Fatal(err)
		}
		if err := p.Fail(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := throttle.Acquire(ctx, "username:eve"); !errors.Is(err, pglimit.ErrLimited) {
		t.Fatalf("a third attempt: %v, want it throttled", err)
	}
	if n, err := throttle.Reset(ctx, "eve"); err != nil || n != 2 {
		t.Fatalf("Reset: %d, %v", n, err)
	}
	p, err := lenient.Acquire(ctx, "username:frank")
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Fail(ctx); err != nil {
		t.Fatal(err)
	}
	ok, err := throttle.Acquire(ctx, "username:dave")
	if err != nil {
		t.Fatal(err)
	}
	if err := ok.Succeed(ctx); err != nil {
		t.Fatal(err)
	}
	rate, err := ratelimit.New(pool, ratelimit.Options{Key: noKey, Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Hour}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := rate.Reset(ctx, "k"); err != nil {
		t.Fatal(err)
	}

	// Every statement the sign-in throttle's decisions made, and the
	// resets, planned by Citus on a fresh session.
	router := []string{"LoginAttemptGet", "LoginAttemptReserve", "LoginAttemptRecordFailure", "LoginAttemptClear",
		"APIRequestWindowReset"}
	calls := log.byName()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	for _, name := range router {
		c, ok := calls[name]
		if !ok {
			t.Errorf("%s was not run", name)
			continue
		}
		var plan []string
		rows, err := conn.Query(ctx, "EXPLAIN "+c.sql, c.args...)
		if err != nil {
			t.Errorf("EXPLAIN %s: %v", name, err)
			continue
		}
		for rows.Next() {
			var line string
			if err := rows.Scan(&line); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, line)
		}
		if err := rows.Err(); err != nil {
			t.Errorf("EXPLAIN %s: %v", name, err)
			continue
		}
		text := strings.Join(plan, "\n")
		if !oneTask.MatchString(text) || strings.Contains(text, "Distributed Subplan") {
			t.Errorf("%s is not a router statement on Citus:\n%s", name, text)
		}
	}
}

// oneTask is the line of a router plan: one task, on one shard.
var oneTask = regexp.MustCompile(`(?m)^\s*Task Count: 1$`)

func pgxQueryRow(ctx context.Context, url, sql string, dst ...any) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql).Scan(dst...)
}
