package main

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/housekeeping"
	"github.com/pglimit/pglimit/ratelimit"
)

// The churn's mix: the share of each operation, the number of keys each
// draws from and how long a slot is held. Heavy and in-flight slots are
// claimed, held and released; upload slots and failed sign-ins stay for the
// window; rate rows lapse a tenth of a second after their last request.
var churnMix = []struct {
	op    string
	share float64
	keys  int
	hold  time.Duration // the longest hold; each is uniform in [0, hold)
}{
	{OpHeavy, 0.15, 500, 20 * time.Millisecond},
	{OpInflight, 0.35, 500, 10 * time.Millisecond},
	{OpRate, 0.35, 5000, 0},
	{OpFailure, 0.10, 20000, 0},
	{OpUpload, 0.05, 5000, 0},
}

// churnPolicy is the churn's rate limit: 10 a second with bursts of 20 per
// key, so keys are refused now and then and their rows lapse 0.1 s after
// their last request.
var churnPolicy = ratelimit.Policy{Name: "churn", Limit: 10, Window: time.Second, Burst: 20}

// Sample is the state of the limit tables at one moment of the churn, and
// what happened since the sample before.
type Sample struct {
	// At is the time since the churn started.
	At time.Duration
	// Ops, Refused and Errors count the operations since the last sample.
	Ops, Refused, Errors int64
	// HeavyP50, HeavyP99, InflightP50, InflightP99: the latency of the
	// claims (Acquire) since the last sample.
	HeavyP50, HeavyP99, InflightP50, InflightP99 time.Duration
	// CPU is the server CPU since the last sample.
	CPU time.Duration
	// Tables are the limit tables, by name.
	Tables []TableSample
	// Held are the live slots of each kind (the views heavy_permit,
	// request_in_flight and upload_window of pglimit.slot), by kind.
	Held map[string]int64
	// Final marks the sample taken after the load stopped, every window
	// lapsed and housekeeping ran once.
	Final bool
}

// TableSample is one table of pglimit at one moment.
type TableSample struct {
	Name string
	// Rows is count(*); Live the rows that have not lapsed.
	Rows, Live int64
	// NLive and NDead are pg_stat_user_tables' estimates.
	NLive, NDead int64
	// TableBytes (the heap), IndexBytes (all its indexes) and TotalBytes
	// (pg_total_relation_size: heap, indexes, free space and visibility
	// maps).
	TableBytes, IndexBytes, TotalBytes int64
	// Autovacuums and Autoanalyzes count autovacuum's runs on the table
	// since the churn started.
	Autovacuums, Autoanalyzes int64
}

// Table returns the sample of the table name.
func (s Sample) Table(name string) (TableSample, bool) {
	i := slices.IndexFunc(s.Tables, func(t TableSample) bool { return t.Name == name })
	if i < 0 {
		return TableSample{}, false
	}
	return s.Tables[i], true
}

// limitTables are the tables sampled: every table of pglimit's. The slots
// of every kind are rows of pglimit.slot; slotKinds are its kinds, whose
// live slots are sampled too.
// churnHeartbeat is the replicas' heartbeat in the churn: a registry row
// lapses three of them after its last.
const churnHeartbeat = time.Second

var limitTables = []string{"slot", "login_attempt", "api_request_window", "refusal_minute", "replica", "ban"}

// slotKinds are the kinds of slot (the views of pglimit.slot).
var slotKinds = []string{"heavy_permit", "request_in_flight", "upload_window"}

// Churn is the outcome of the long run.
type Churn struct {
	Duration time.Duration
	Rate     float64 // the target rate
	Samples  []Sample
	// Ops, Refused and Errors over the whole churn.
	Ops, Refused, Errors int64
	// Load are the machine's 1-minute load averages at the start and the
	// end.
	LoadStart, LoadEnd string
}

// churnLoad is the state of the running load shared with the sampler.
type churnLoad struct {
	mu                    sync.Mutex
	heavyLat, inflightLat []time.Duration
	ops, refusedN, errs   atomic.Int64
}

// churn runs the mix for the configured duration, sampling the tables.
func (e *env) churn(ctx context.Context) (*Churn, error) {
	if err := e.emptyTables(ctx); err != nil {
		return nil, err
	}
	base, err := e.readTables(ctx, nil)
	if err != nil {
		return nil, err
	}
	out := &Churn{Duration: e.cfg.Duration, Rate: e.cfg.Rate, LoadStart: loadAverage()}

	sets := make([]*limiters, len(e.pools))
	for i := range sets {
		if sets[i], err = newLimiters(e.pools[i], limiterConfig{
			replica:    fmt.Sprintf("churn-%d", i+1),
			heavyLimit: 2, installationLimit: 64, inflightLimit: 8, uploadLimit: 5, failureLimit: 5,
			window: e.cfg.Window, rate: churnPolicy,
		}); err != nil {
			return nil, err
		}
	}

	// Every replica runs pglimit's background parts, as a service does:
	// the registry's heartbeat and housekeeping.
	runCtx, stopRun := context.WithCancel(ctx)
	var runs sync.WaitGroup
	runErrs := make(chan error, len(e.pools))
	for i, pool := range e.pools {
		runs.Add(1)
		go func() {
			defer runs.Done()
			if err := pglimit.Run(runCtx, pool, pglimit.RunOptions{
				Replica: fmt.Sprintf("churn-%d", i+1), Heartbeat: churnHeartbeat, Housekeeping: e.cfg.Housekeeping, Logger: e.quiet,
			}); err != nil {
				runErrs <- err
			}
		}()
	}
	defer func() { stopRun(); runs.Wait() }()

	var load churnLoad
	limiter := rate.NewLimiter(rate.Limit(e.cfg.Rate), e.cfg.Workers)
	loadCtx, stopLoad := context.WithTimeout(ctx, e.cfg.Duration)
	defer stopLoad()
	var workers sync.WaitGroup
	for w := 0; w < e.cfg.Workers; w++ {
		workers.Add(1)
		go func() {
			defer workers.Done()
			e.churnWorker(loadCtx, w, sets[w%len(sets)], limiter, &load)
		}()
	}

	before, err := e.cpu.read(ctx)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	tick := time.NewTicker(e.cfg.Sample)
	defer tick.Stop()
	for done := false; !done; {
		select {
		case <-tick.C:
		case <-loadCtx.Done():
			done = true
		case err := <-runErrs:
			stopLoad()
			workers.Wait()
			return out, fmt.Errorf("pglimit.Run: %w", err)
		}
		if done {
			workers.Wait()
		}
		s, after, err := e.sample(ctx, &load, before, base)
		if err != nil {
			stopLoad()
			workers.Wait()
			return out, err
		}
		s.At = time.Since(start)
		before = after
		out.Samples = append(out.Samples, s)
		out.Ops += s.Ops
		out.Refused += s.Refused
		out.Errors += s.Errors
		e.logf("churn %6s: %5d ops (%d refused, %d errors), heavy claim p50 %v p99 %v, server %.2f cores, %s",
			s.At.Round(time.Second), s.Ops, s.Refused, s.Errors, s.HeavyP50.Round(10*time.Microsecond),
			s.HeavyP99.Round(10*time.Microsecond), s.CPU.Seconds()/e.cfg.Sample.Seconds(), sizesLine(s))
	}
	out.LoadEnd = loadAverage()

	// Every permit was released and every window lapses: after the
	// longest window and one sweep, the limit tables hold nothing.
	// The replicas stop first: each deletes its registry row, and a row
	// whose delete failed (a loaded machine: the statement's timeout) lapses
	// three heartbeats after the last, within the wait as the windows do.
	wait := max(e.cfg.Window, 3*churnHeartbeat) + time.Second
	stopRun()
	runs.Wait()
	e.logf("churn: load stopped; waiting %v for the windows and the registry rows to lapse, then one housekeeping sweep", wait)
	sleep(ctx, wait)
	// A stopped replica's last sweep may still hold the lock on the server
	// for a moment (its canceled statement's backend has not ended its
	// transaction yet): the sweep is tried again until it runs.
	for attempt := 1; ; attempt++ {
		deleted, err := housekeeping.Sweep(ctx, e.observer)
		if err != nil {
			return out, fmt.Errorf("housekeeping: %w", err)
		}
		if deleted != nil {
			break
		}
		if attempt == 40 {
			return out, errors.New("housekeeping: the final sweep did not run in 10 s (another sweeper held the lock)")
		}
		sleep(ctx, 250*time.Millisecond)
	}
	final, _, err := e.sample(ctx, &load, before, base)
	if err != nil {
		return out, err
	}
	final.At, final.Final = time.Since(start), true
	out.Samples = append(out.Samples, final)
	e.logf("churn: final: %s", sizesLine(final))
	return out, ctx.Err()
}

// churnWorker runs operations of the mix at the shared rate until ctx ends.
func (e *env) churnWorker(ctx context.Context, w int, l *limiters, limiter *rate.Limiter, load *churnLoad) {
	rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
	for {
		if err := limiter.Wait(ctx); err != nil {
			return
		}
		x := rnd.Float64()
		mix := churnMix[len(churnMix)-1]
		for _, m := range churnMix {
			if x < m.share {
				mix = m
				break
			}
			x -= m.share
		}
		key := keyOf(e.run, "churn-"+mix.op, rnd.IntN(mix.keys))
		var hold time.Duration
		if mix.hold > 0 {
			hold = time.Duration(rnd.Int64N(int64(mix.hold)))
		}
		// An operation that has started finishes: the load stops between
		// operations, never with a slot claimed and not released.
		opCtx := context.WithoutCancel(ctx)
		var err error
		switch mix.op {
		case OpHeavy:
			var claim time.Duration
			claim, err = l.heavyOp(opCtx, key, hold)
			load.record(&load.heavyLat, claim)
		case OpInflight:
			var claim time.Duration
			claim, err = l.inflightOp(opCtx, key, hold)
			load.record(&load.inflightLat, claim)
		case OpRate:
			err = l.rateOp(opCtx, key)
		case OpFailure:
			err = l.failureOp(opCtx, key)
		case OpUpload:
			err = l.uploadOp(opCtx, key)
		}
		load.ops.Add(1)
		switch {
		case err == nil:
		case refused(err):
			load.refusedN.Add(1)
		default:
			load.errs.Add(1)
			e.noteError(mix.op, err)
		}
	}
}

func (l *churnLoad) record(into *[]time.Duration, d time.Duration) {
	l.mu.Lock()
	*into = append(*into, d)
	l.mu.Unlock()
}

// sample reads the tables and takes what the load did since the last one.
func (e *env) sample(ctx context.Context, load *churnLoad, before cpuReading, base map[string]TableSample) (Sample, cpuReading, error) {
	var s Sample
	load.mu.Lock()
	heavyLat, inflightLat := load.heavyLat, load.inflightLat
	load.heavyLat, load.inflightLat = nil, nil
	load.mu.Unlock()
	slices.Sort(heavyLat)
	slices.Sort(inflightLat)
	s.HeavyP50, s.HeavyP99 = percentile(heavyLat, 0.5), percentile(heavyLat, 0.99)
	s.InflightP50, s.InflightP99 = percentile(inflightLat, 0.5), percentile(inflightLat, 0.99)
	s.Ops, s.Refused, s.Errors = load.ops.Swap(0), load.refusedN.Swap(0), load.errs.Swap(0)
	after, err := e.cpu.read(ctx)
	if err != nil {
		return s, before, err
	}
	s.CPU = since(before, after).Server
	if s.CPU == 0 {
		s.CPU = since(before, after).Backends
	}
	tables, err := e.readTables(ctx, base)
	if err != nil {
		return s, after, err
	}
	for _, name := range limitTables {
		s.Tables = append(s.Tables, tables[name])
	}
	if s.Held, err = e.readHeld(ctx); err != nil {
		return s, after, err
	}
	return s, after, nil
}

// readHeld counts the live slots of every kind (an observer query, as
// readTables's).
func (e *env) readHeld(ctx context.Context) (map[string]int64, error) {
	held := map[string]int64{}
	for _, kind := range slotKinds {
		held[kind] = 0
	}
	rows, err := e.observer.Query(ctx, `SELECT kind, count(*) FROM pglimit.slot WHERE expires_at > now() GROUP BY kind`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var kind string
		var n int64
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, err
		}
		held[kind] = n
	}
	return held, rows.Err()
}

// readTables reads every limit table's rows, sizes and autovacuum counts;
// the counts are taken from base's (nil: as they are).
//
// Observer queries, written here rather than in sql/queries: they read the
// statistics catalogs and count the rows of each table by name, which is
// how an operator watches the tables, not a statement pglimit runs.
func (e *env) readTables(ctx context.Context, base map[string]TableSample) (map[string]TableSample, error) {
	out := map[string]TableSample{}
	rows, err := e.observer.Query(ctx, `
SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid), pg_total_relation_size(c.oid),
       coalesce(s.n_live_tup, 0), coalesce(s.n_dead_tup, 0),
       coalesce(s.autovacuum_count, 0), coalesce(s.autoanalyze_count, 0)
FROM pg_class AS c
JOIN pg_namespace AS n ON n.oid = c.relnamespace
LEFT JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE n.nspname = 'pglimit' AND c.relname = ANY($1)`, limitTables)
	if err != nil {
		return nil, err
	}
	for rows.Next() {
		var t TableSample
		if err := rows.Scan(&t.Name, &t.TableBytes, &t.IndexBytes, &t.TotalBytes, &t.NLive, &t.NDead, &t.Autovacuums, &t.Autoanalyzes); err != nil {
			rows.Close()
			return nil, err
		}
		if b, ok := base[t.Name]; ok {
			t.Autovacuums -= b.Autovacuums
			t.Autoanalyzes -= b.Autoanalyzes
		}
		out[t.Name] = t
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, name := range limitTables {
		t, ok := out[name]
		if !ok {
			return nil, fmt.Errorf("table pglimit.%s not found: is the database migrated?", name)
		}
		ident := pgx.Identifier{"pglimit", name}.Sanitize()
		if err := e.observer.QueryRow(ctx, "SELECT count(*), count(*) FILTER (WHERE expires_at > now()) FROM "+ident).Scan(&t.Rows, &t.Live); err != nil {
			return nil, err
		}
		out[name] = t
	}
	return out, nil
}

// emptyTables empties the limit tables before the churn, so that what the
// throughput phase left does not count in the churn's sizes, and waits
// until the backends of that phase have ended (and so reported their
// statistics), so that the dead rows they left are not counted either.
// TRUNCATE of the run's own data and a forced flush of its statistics:
// not statements of pglimit's.
func (e *env) emptyTables(ctx context.Context) error {
	for deadline := time.Now().Add(30 * time.Second); ; {
		var n int
		if err := e.observer.QueryRow(ctx, "SELECT count(*) FROM pg_stat_activity WHERE application_name = $1", e.appName).Scan(&n); err != nil {
			return err
		}
		if n <= e.cfg.Replicas*e.cfg.PoolConns || time.Now().After(deadline) {
			break // only the churn's own connections are left
		}
		sleep(ctx, 100*time.Millisecond)
	}
	_, err := e.observer.Exec(ctx, "TRUNCATE pglimit.slot, pglimit.login_attempt, pglimit.api_request_window, pglimit.refusal_minute, pglimit.ban")
	if err != nil {
		return fmt.Errorf("emptying the limit tables before the churn: %w", err)
	}
	// The truncation zeroes the tables' live and dead counts when this
	// backend reports it: at once, not at its next idle moment.
	if _, err := e.observer.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		return err
	}
	sleep(ctx, 200*time.Millisecond)
	return nil
}

// sizesLine summarises a sample's sizes for the progress lines.
func sizesLine(s Sample) string {
	var b []byte
	for _, t := range s.Tables {
		if t.Name == "replica" || t.Name == "refusal_minute" {
			continue
		}
		b = fmt.Appendf(b, "%s %d rows %s; ", t.Name, t.Rows, kB(t.TotalBytes))
	}
	return string(b)
}
