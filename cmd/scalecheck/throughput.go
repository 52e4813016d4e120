package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// OpResult is one operation measured at one number of clients.
type OpResult struct {
	Name     string
	Clients  int
	Replicas int
	// Ops counts the operations completed; Refused and Errors those that
	// were refused by a limit (none should be) or failed.
	Ops, Refused, Errors int64
	// Wall is the time from the start until the last client stopped.
	Wall time.Duration
	// P50 and P99 are nearest-rank percentiles of the operations' latency.
	P50, P99 time.Duration
	// CPU is what the database server spent meanwhile.
	CPU cpuUsed
	// Client is the CPU time of this process meanwhile (the replicas'
	// side: pglimit, pgx and the measuring loop).
	Client time.Duration
	// StatementTime is pg_stat_statements' total execution time of the
	// run's statements meanwhile; -1 when it is not available.
	StatementTime time.Duration
	// Calls is pg_stat_statements' count of those statements.
	Calls int64
	// WAL is the write-ahead log the server wrote meanwhile, in bytes (the
	// whole server's: on a shared server, others' writes count too).
	WAL int64
}

// WALPerOp is the write-ahead log one operation wrote, in bytes.
func (r OpResult) WALPerOp() float64 {
	if r.Ops == 0 {
		return 0
	}
	return float64(r.WAL) / float64(r.Ops)
}

// ServerCPU is the CPU the figure rests on: the whole server's when it was
// counted, else the run's backends'.
func (r OpResult) ServerCPU() time.Duration {
	if r.CPU.Server > 0 {
		return r.CPU.Server
	}
	return r.CPU.Backends
}

// PerCoreSecond is the operations per second of server CPU: what one
// PostgreSQL core sustains. 0 when no CPU was counted.
func (r OpResult) PerCoreSecond() float64 {
	if cpu := r.ServerCPU(); cpu > 0 {
		return float64(r.Ops) / cpu.Seconds()
	}
	return 0
}

// PerSecond is the operations per second of wall time.
func (r OpResult) PerSecond() float64 { return float64(r.Ops) / r.Wall.Seconds() }

// ServerPerOp is the server CPU one operation costs.
func (r OpResult) ServerPerOp() time.Duration {
	if r.Ops == 0 {
		return 0
	}
	return r.ServerCPU() / time.Duration(r.Ops)
}

// ClientPerOp is the CPU one operation costs this process.
func (r OpResult) ClientPerOp() time.Duration {
	if r.Ops == 0 {
		return 0
	}
	return r.Client / time.Duration(r.Ops)
}

// Busy is the server's mean busy cores over the measurement.
func (r OpResult) Busy() float64 { return r.ServerCPU().Seconds() / r.Wall.Seconds() }

// processCPU is this process's user + system CPU time.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// throughput measures every operation at every number of clients.
func (e *env) throughput(ctx context.Context) ([]OpResult, error) {
	// Every replica runs the invalidation bus, as pglimit.Run runs it:
	// a replica keeps slots (and answers refusals from memory) only while
	// its bus is live.
	// On Citus workers (replicaURLs) there is no bus: it listens to the
	// coordinator, which holds its key; the operations that need it (kept
	// slots, borrowing) are measured through the coordinator only.
	ops := Operations
	if len(e.replicaURLs) == 0 {
		stopBuses, err := pgtest.RunBuses(ctx, e.quiet, e.pools...)
		if err != nil {
			return nil, err
		}
		defer stopBuses()
	} else {
		ops = slices.DeleteFunc(slices.Clone(ops), func(op string) bool { return op == OpRateBorrowed || op == OpInflightKept })
	}
	var out []OpResult
	for _, clients := range e.cfg.Clients {
		replicas := min(clients, e.cfg.Replicas)
		sets := make([]*limiters, replicas)
		for i := range sets {
			var err error
			sets[i], err = newLimiters(e.pools[i], limiterConfig{
				replica:    fmt.Sprintf("scale-%d", i+1),
				heavyLimit: 2, installationLimit: max(64, 2*clients),
				inflightLimit: 8, uploadLimit: 5, failureLimit: 1000,
				window: time.Hour,
				rate:   ratelimit.Policy{Name: "scale", Limit: 10000, Window: time.Second, Burst: 10000},
			})
			if err != nil {
				return nil, err
			}
		}
		for _, name := range ops {
			r, err := e.measure(ctx, name, clients, sets)
			if err != nil {
				return nil, fmt.Errorf("%s at %d clients: %w", name, clients, err)
			}
			e.logf("%-32s %2d clients: %7.0f ops/s, p50 %v, server %v/op, %.0f per core-second, client %v/op, %d refused, %d errors",
				name, clients, r.PerSecond(), r.P50.Round(time.Microsecond), r.ServerPerOp().Round(100*time.Nanosecond),
				r.PerCoreSecond(), r.ClientPerOp().Round(100*time.Nanosecond), r.Refused, r.Errors)
			if len(r.CPU.Nodes) > 0 {
				e.logf("%-32s %2d clients: coordinator %v/op, workers %v/op", name, clients,
					r.NodePerOp(0).Round(100*time.Nanosecond), r.WorkersPerOp().Round(100*time.Nanosecond))
			}
			out = append(out, r)
			if ctx.Err() != nil {
				return out, ctx.Err()
			}
		}
	}
	return out, nil
}

// measure runs one operation with clients loops spread over the replicas'
// limiter sets for the configured time.
func (e *env) measure(ctx context.Context, name string, clients int, sets []*limiters) (OpResult, error) {
	r := OpResult{Name: name, Clients: clients, Replicas: len(sets), StatementTime: -1}
	phase := fmt.Sprintf("%s-c%d-%d", e.run, clients, slices.Index(Operations, name))
	var (
		start   = make(chan struct{})
		stop    atomic.Bool
		wg, rdy sync.WaitGroup
		mu      sync.Mutex
		lat     []time.Duration
	)
	for c := 0; c < clients; c++ {
		l := sets[c%len(sets)]
		op := e.opFunc(name, l, phase, c)
		wg.Add(1)
		rdy.Add(1)
		go func() {
			defer wg.Done()
			// One unrecorded operation first: the connection and its
			// prepared statements are ready when the measuring starts.
			_ = op(ctx, -1)
			rdy.Done()
			<-start
			var mine []time.Duration
			var n, refusedN, errs int64
			for i := 0; !stop.Load() && ctx.Err() == nil; i++ {
				t := time.Now()
				err := op(ctx, i)
				mine = append(mine, time.Since(t))
				switch {
				case err == nil:
				case refused(err):
					refusedN++
				default:
					errs++
					e.noteError(name, err)
				}
				n++
			}
			mu.Lock()
			lat = append(lat, mine...)
			r.Ops += n
			r.Refused += refusedN
			r.Errors += errs
			mu.Unlock()
		}()
	}
	rdy.Wait()
	statements := e.statements && e.resetStatements(ctx)
	before, err := e.cpu.read(ctx)
	if err != nil {
		return r, err
	}
	wal0, err := e.walPosition(ctx)
	if err != nil {
		return r, err
	}
	client0 := processCPU()
	t0 := time.Now()
	close(start)
	sleep(ctx, e.cfg.OpDuration)
	stop.Store(true)
	wg.Wait()
	r.Wall = time.Since(t0)
	r.Client = processCPU() - client0
	after, err := e.cpu.read(ctx)
	if err != nil {
		return r, err
	}
	r.CPU = since(before, after)
	wal1, err := e.walPosition(ctx)
	if err != nil {
		return r, err
	}
	r.WAL = wal1 - wal0
	if statements {
		r.StatementTime, r.Calls = e.statementTime(ctx)
	}
	slices.Sort(lat)
	r.P50, r.P99 = percentile(lat, 0.50), percentile(lat, 0.99)
	return r, nil
}

// opFunc returns client c's operation; i is its iteration (-1: the
// warm-up), which moves the keys that must not reach their limit.
func (e *env) opFunc(name string, l *limiters, phase string, c int) func(context.Context, int) error {
	key := fmt.Sprintf("%s-%d", phase, c)
	switch name {
	case OpHeavy:
		return func(ctx context.Context, _ int) error { _, err := l.heavyOp(ctx, key, 0); return err }
	case OpInflight:
		return func(ctx context.Context, _ int) error { _, err := l.inflightOp(ctx, key, 0); return err }
	case OpCheck:
		return func(ctx context.Context, _ int) error { return l.checkOp(ctx, key) }
	case OpFailure:
		// A key takes 100 failures, then the next key: none reaches the
		// limit, and the table grows as it does with many usernames.
		return func(ctx context.Context, i int) error { return l.failureOp(ctx, fmt.Sprintf("%s-%d", key, (i+1)/100)) }
	case OpUpload:
		// A user's 1st to 5th upload of the window, then the next user.
		return func(ctx context.Context, i int) error { return l.uploadOp(ctx, fmt.Sprintf("%s-%d", key, (i+1)/5)) }
	case OpRateBorrowed:
		// One hot key per client, at a million a second: never refused.
		return func(ctx context.Context, _ int) error { return l.borrowOp(ctx, key) }
	case OpInflightKept:
		// One token per client on its replica, a request every keptPace:
		// steady, at a pace a service sees (back to back with no handler
		// it would run a million a second, and the lease's renewals, paid
		// per second, would vanish in them).
		return func(ctx context.Context, _ int) error {
			err := l.keptOp(ctx, key)
			sleep(ctx, keptPace)
			return err
		}
	case OpRate:
		// Four keys in turn: one client decides faster than a policy's
		// most (pglimit.MaxLimit a second) allows one key.
		return func(ctx context.Context, i int) error { return l.rateOp(ctx, fmt.Sprintf("%s-%d", key, (i+4)%4)) }
	}
	panic("scalecheck: unknown operation " + name)
}

// keptPace is how often a client of the kept in-flight operation sends a
// request: a thousand a second per token.
const keptPace = time.Millisecond

// percentile returns the nearest-rank q-percentile of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*q+0.999999) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}

// walPosition is the server's current write-ahead log position in bytes.
func (e *env) walPosition(ctx context.Context) (int64, error) {
	var lsn int64
	err := e.observer.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint").Scan(&lsn)
	return lsn, err
}
