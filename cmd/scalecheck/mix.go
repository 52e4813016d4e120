package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/ratelimit"
)

// The cold mix (-mix cold): the limits of the reference service, at its
// default flags, decided through the library's API by -replicas replicas
// (pools, each with its own limiters and its own invalidation bus, as
// pglimit.Run runs it), for a crowd of users who each send one request
// every 10 s to the next replica in turn (a balancer without
// stickiness): the user's API rate (100/s, burst 200), its token's
// in-flight cap (8; requests hold it 2 ms, a heavy one 20 ms), 1 % of the
// requests a heavy read (4 per user, 4 for the installation), sign-ins
// once an hour per user with 10 % failing (5 per pair, 20 per address,
// 50 per username). Beside them, clients that push each limit: a user at
// 150 % of the rate over every replica and one at 90 % on one replica; a
// token at 150 % of the in-flight cap (12 requests at once, each 200 ms)
// over every replica and one at 90 % (7 at once) on one replica; and
// -steady of the requests from steady clients (sticky, one request every
// 20 ms: half the rate). A replica is killed (its pool closed, its shares
// never given back) a third into the measured phase and another joins
// half way.
//
// The server is a throwaway cluster of the run's own, so its whole CPU is
// the limits' (nothing else runs on it: there is no service's work to
// subtract); statements are pg_stat_statements' calls of pglimit's
// statements. The shares (ratelimit.Options.Shares, inflight
// Options.Shares) start spending a lease after their claim, the in-flight
// ones MaxDuration + 35 s after it (2 min 35 s at the default 2 min), so
// the load runs -warmup first, then -mix-duration measured.
type mixConfig struct {
	Replicas   int
	Users      int
	Steady     float64
	Warmup     time.Duration
	Duration   time.Duration
	MaxRequest time.Duration
	JSON       bool
	// Kill kills a replica a third into the measure and starts another
	// half way.
	Kill bool
	// Pushers runs the clients that push each limit.
	Pushers bool
}

// mixReport is what a cold-mix run measured (the JSON of -json).
type mixReport struct {
	Mix                   string   `json:"mix"`
	Replicas              int      `json:"replicas"`
	Users                 int      `json:"users"`
	SteadyFraction        float64  `json:"steady_fraction"`
	MeasuredSeconds       float64  `json:"measured_seconds"`
	Requests              int64    `json:"requests"`
	RequestsPerSecond     float64  `json:"requests_per_second"`
	ServerCPUUsPerRequest float64  `json:"server_cpu_us_per_request"`
	StatementsPerRequest  float64  `json:"statements_per_request"`
	FalseRefusals         int64    `json:"false_refusals"`
	Judged                int64    `json:"judged_requests"`
	FalseRefusalRatio     float64  `json:"false_refusal_ratio"`
	Exceeded              []string `json:"exceeded"`
	Highest               []string `json:"highest"`
	Errors                int64    `json:"errors"`
	// ErrorSamples are the first distinct errors of the run (warm-up
	// included).
	ErrorSamples []string `json:"error_samples"`
	// LostToTheKill are the requests that failed on the replica killed
	// while they ran: its pool closed under them, as a dead replica's
	// requests fail; not a decision that failed.
	LostToTheKill int64 `json:"lost_to_the_kill"`
}

// mixReplica is one replica of the mix.
type mixReplica struct {
	pool                *pgxpool.Pool
	stop                context.CancelFunc
	rate                *ratelimit.Limiter
	flight              *inflight.Limiter
	heavy               *heavy.Limiter
	pair, addr, usernme *signin.Limiter
	dead                atomic.Bool
}

func newMixReplica(ctx context.Context, url string, i int, maxRequest time.Duration, quiet *slog.Logger) (*mixReplica, error) {
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	pc.MaxConns = 16
	pc.ConnConfig.RuntimeParams["application_name"] = fmt.Sprintf("scalecheck-mix-%d", i)
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		return nil, err
	}
	r := &mixReplica{pool: pool}
	rctx, stop := context.WithCancel(context.Background())
	r.stop = stop
	go func() { _ = pglimit.Run(rctx, pool, pglimit.RunOptions{Logger: quiet}) }()
	noHTTP := func(*http.Request) (string, bool) { return "", false }
	name := fmt.Sprintf("replica-%d", i)
	if r.rate, err = ratelimit.New(pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "api", Limit: 100, Window: time.Second, Burst: 200}},
		Logger: quiet}); err != nil {
		return nil, err
	}
	if r.flight, err = inflight.New(pool, inflight.Options{Key: noHTTP, MaxDuration: maxRequest, Replica: name, Logger: quiet}); err != nil {
		return nil, err
	}
	if r.heavy, err = heavy.New(pool, heavy.Options{Name: "event-history", Key: noHTTP, Limit: 4, InstallationLimit: 4,
		Time: 10 * time.Second, Replica: name, Logger: quiet}); err != nil {
		return nil, err
	}
	if r.pair, err = signin.New(pool, signin.Options{Scope: "pair", Logger: quiet}); err != nil {
		return nil, err
	}
	if r.addr, err = signin.New(pool, signin.Options{Scope: "address", Limit: 20, Logger: quiet}); err != nil {
		return nil, err
	}
	if r.usernme, err = signin.New(pool, signin.Options{Limit: 50, Logger: quiet}); err != nil {
		return nil, err
	}
	return r, nil
}

// kill stops the replica as a killed process stops: no request reaches it,
// its connections close, its shares are never given back.
func (r *mixReplica) kill() {
	r.dead.Store(true)
	r.stop()
	r.pool.Close()
}

// mixLedger is what the clients saw.
type mixLedger struct {
	requests, errors, judged, falseRefusals, lost atomic.Int64

	mu       sync.Mutex
	rate150  []admission // the 150 % user's answers
	flight   map[string]*concurrency
	refusals map[string]int64 // a judged client's refusals, by client
	samples  []string         // the first distinct errors
}

// fail counts err, an error of a decision on r: lost to the kill when r
// died (its pool closed under the request), else a decision that failed.
func (l *mixLedger) fail(r *mixReplica, err error) {
	if r.dead.Load() {
		l.lost.Add(1)
		return
	}
	l.errors.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.samples) < 5 && !slices.Contains(l.samples, err.Error()) {
		l.samples = append(l.samples, err.Error())
	}
}

type admission struct {
	sent, received time.Time
	admitted       bool
}

// concurrency counts a token's requests holding their slot at once, as
// the client holding them sees it: an observer independent of pglimit's
// tables.
type concurrency struct{ now, peak int }

func (l *mixLedger) hold(token string, d int) {
	l.mu.Lock()
	c := l.flight[token]
	if c == nil {
		c = &concurrency{}
		l.flight[token] = c
	}
	c.now += d
	c.peak = max(c.peak, c.now)
	l.mu.Unlock()
}

// request is one request of user (its rate key and token) on r: the rate,
// the in-flight cap, and for a heavy one the heavy permit, held for hold.
// judged: a refusal is a false one (the client is at or under 90 % of
// every limit).
func (l *mixLedger) request(ctx context.Context, r *mixReplica, user string, hold time.Duration, heavyRead, judged bool) (admitted bool) {
	l.requests.Add(1)
	if judged {
		l.judged.Add(1)
	}
	refused := func(err error) bool {
		var le *ratelimit.LimitError
		var lr *limit.Refusal
		if errors.As(err, &le) || errors.As(err, &lr) {
			// A refusal by the installation's heavy cap is not one of the
			// client's own limits: not judged.
			if judged && !(lr != nil && lr.Scope == "installation") {
				kind := "rate"
				if lr != nil {
					kind = lr.Kind
				}
				l.falseRefusals.Add(1)
				l.mu.Lock()
				l.refusals[user+" by "+kind]++
				l.mu.Unlock()
			}
			return true
		}
		l.fail(r, err)
		return false
	}
	if _, err := r.rate.Acquire(ctx, "user:"+user); err != nil {
		refused(err)
		return false
	}
	p, err := r.flight.Acquire(ctx, user)
	if err != nil {
		refused(err)
		return false
	}
	l.hold(user, 1)
	if heavyRead {
		if hp, err := r.heavy.Acquire(ctx, user); err != nil {
			refused(err)
		} else {
			time.Sleep(hold)
			_ = hp.Release(ctx)
		}
	} else {
		time.Sleep(hold)
	}
	l.hold(user, -1)
	_ = p.Release(ctx)
	return true
}

// signIn is one sign-in of user through the three throttles, failing when
// fail.
func (l *mixLedger) signIn(ctx context.Context, r *mixReplica, user, address string, fail bool) {
	l.requests.Add(1)
	pa, err := r.addr.Acquire(ctx, "address:"+address)
	if err != nil {
		l.fail(r, err)
		return
	}
	pp, err := r.pair.Acquire(ctx, "pair:"+user+"|address:"+address)
	if err != nil {
		l.fail(r, err)
		_ = pa.Release(ctx)
		return
	}
	pu, err := r.usernme.Acquire(ctx, "username:"+user)
	if err != nil {
		l.fail(r, err)
		_ = pp.Release(ctx)
		_ = pa.Release(ctx)
		return
	}
	if fail {
		_, _, _ = pu.Fail(ctx), pp.Fail(ctx), pa.Fail(ctx)
	} else {
		_, _, _ = pu.Succeed(ctx), pp.Succeed(ctx), pa.Succeed(ctx)
	}
}

// runMix runs the cold mix and reports it.
func runMix(ctx context.Context, c mixConfig, stdout, progress io.Writer) (int, error) {
	logf := func(format string, args ...any) { fmt.Fprintf(progress, "scalecheck: "+format+"\n", args...) }
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	logf("cold mix: starting a throwaway PostgreSQL (pg_stat_statements loaded)")
	cluster, err := embedpg.Start(ctx, embedpg.Options{Settings: map[string]string{"shared_preload_libraries": "pg_stat_statements"}})
	if err != nil {
		return 2, err
	}
	defer func() { _ = cluster.Stop() }()
	url := cluster.URL("postgres")
	observer, err := pgxpool.New(ctx, url)
	if err != nil {
		return 2, err
	}
	defer observer.Close()
	if err := pglimit.Migrate(ctx, observer); err != nil {
		return 2, err
	}
	if _, err := observer.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements"); err != nil {
		return 2, err
	}
	var (
		mu       sync.Mutex
		replicas []*mixReplica
	)
	for i := range c.Replicas {
		r, err := newMixReplica(ctx, url, i, c.MaxRequest, quiet)
		if err != nil {
			return 2, err
		}
		replicas = append(replicas, r)
	}
	defer func() {
		for _, r := range replicas {
			if !r.dead.Load() {
				r.kill()
			}
		}
	}()
	live := func() []*mixReplica {
		mu.Lock()
		defer mu.Unlock()
		var out []*mixReplica
		for _, r := range replicas {
			if !r.dead.Load() {
				out = append(out, r)
			}
		}
		return out
	}
	var turn atomic.Uint64
	next := func() *mixReplica { rs := live(); return rs[int(turn.Add(1))%len(rs)] }

	l := &mixLedger{flight: map[string]*concurrency{}, refusals: map[string]int64{}}
	loadCtx, stopLoad := context.WithCancel(ctx)
	defer stopLoad()
	var wg sync.WaitGroup
	every := func(d time.Duration, phase time.Duration, f func()) {
		wg.Go(func() {
			select {
			case <-time.After(phase):
			case <-loadCtx.Done():
				return
			}
			t := time.NewTicker(d)
			defer t.Stop()
			for {
				f()
				select {
				case <-t.C:
				case <-loadCtx.Done():
					return
				}
			}
		})
	}
	// The crowd: every user a request every 10 s, 1 % heavy; a sign-in an
	// hour, 10 % failing.
	total := float64(c.Users) / 10
	steadyClients := int(c.Steady * total / 50)
	crowd := int(float64(c.Users) * (1 - c.Steady))
	for u := range crowd {
		user := fmt.Sprintf("user%05d", u+1)
		rng := rand.New(rand.NewPCG(uint64(u), 1))
		every(10*time.Second, time.Duration(rng.Int64N(int64(10*time.Second))), func() {
			l.request(loadCtx, next(), user, 2*time.Millisecond, rng.IntN(100) == 0, true)
		})
	}
	signInsPerSecond := float64(c.Users) / 3600
	every(time.Duration(float64(time.Second)/max(signInsPerSecond, 0.01)), 0, func() {
		u := rand.IntN(c.Users) + 1
		l.signIn(loadCtx, next(), fmt.Sprintf("user%05d", u), fmt.Sprintf("198.51.%d.%d", u/250%250, u%250+1), rand.IntN(10) == 0)
	})
	// Steady clients: sticky, a request every 20 ms.
	for s := range steadyClients {
		user := fmt.Sprintf("steady%04d", s)
		every(20*time.Millisecond, time.Duration(s)*time.Millisecond, func() {
			rs := live()
			l.request(loadCtx, rs[s%len(rs)], user, 2*time.Millisecond, false, true)
		})
	}
	// The pushers.
	if c.Pushers {
		every(time.Second/150, 0, func() {
			sent := time.Now()
			ok := l.request(loadCtx, next(), "push-rate-150", time.Millisecond, false, false)
			l.mu.Lock()
			l.rate150 = append(l.rate150, admission{sent: sent, received: time.Now(), admitted: ok})
			l.mu.Unlock()
		})
		every(time.Second/90, 0, func() {
			l.request(loadCtx, live()[0], "push-rate-90", time.Millisecond, false, true)
		})
		loop := func(n int, user string, sticky, judged bool) {
			for i := range n {
				wg.Go(func() {
					for loadCtx.Err() == nil {
						r := next()
						if sticky {
							r = live()[0]
						}
						if !l.request(loadCtx, r, user, 200*time.Millisecond, false, judged) {
							time.Sleep(50 * time.Millisecond)
						}
						_ = i
					}
				})
			}
		}
		loop(12, "push-flight-150", false, false)
		loop(7, "push-flight-90", true, true)
	}

	logf("cold mix: %d users (%d steady clients), %d replicas, %.0f requests a second; warming up for %v (the shares spend a lease after their claim)",
		c.Users, steadyClients, c.Replicas, total, c.Warmup)
	select {
	case <-time.After(c.Warmup):
	case <-ctx.Done():
		return 2, ctx.Err()
	}
	meter, err := newCPUMeter(ctx, observer, "", true)
	if err != nil {
		return 2, err
	}
	statements := func() int64 {
		var n int64
		_ = observer.QueryRow(ctx, `SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements WHERE query LIKE '%pglimit.%'`).Scan(&n)
		return n
	}
	before, err := meter.read(ctx)
	if err != nil {
		return 2, err
	}
	stmts0, reqs0, judged0, false0, errs0, lost0 := statements(), l.requests.Load(), l.judged.Load(), l.falseRefusals.Load(), l.errors.Load(), l.lost.Load()
	start := time.Now()
	logf("cold mix: measuring for %v; a replica is killed at a third, another joins at half", c.Duration)
	time.Sleep(c.Duration / 3)
	if c.Kill {
		replicas[0].kill()
	}
	time.Sleep(c.Duration/2 - c.Duration/3)
	if c.Kill {
		r, err := newMixReplica(ctx, url, len(replicas), c.MaxRequest, quiet)
		if err != nil {
			return 2, err
		}
		mu.Lock()
		replicas = append(replicas, r)
		mu.Unlock()
	}
	time.Sleep(c.Duration - c.Duration/2)
	after, err := meter.read(ctx)
	if err != nil {
		return 2, err
	}
	elapsed := time.Since(start)
	stmts1, reqs1, judged1, false1, errs1, lost1 := statements(), l.requests.Load(), l.judged.Load(), l.falseRefusals.Load(), l.errors.Load(), l.lost.Load()
	stopLoad()
	wg.Wait()

	rep := mixReport{Mix: "cold", Replicas: c.Replicas, Users: c.Users, MeasuredSeconds: elapsed.Seconds(),
		Requests: reqs1 - reqs0, Judged: judged1 - judged0, FalseRefusals: false1 - false0, Errors: errs1 - errs0,
		LostToTheKill: lost1 - lost0, Exceeded: []string{}}
	if rep.Requests > 0 {
		rep.RequestsPerSecond = float64(rep.Requests) / elapsed.Seconds()
		rep.ServerCPUUsPerRequest = float64(since(before, after).Server.Microseconds()) / float64(rep.Requests)
		rep.StatementsPerRequest = float64(stmts1-stmts0) / float64(rep.Requests)
		rep.SteadyFraction = c.Steady
	}
	if rep.Judged > 0 {
		rep.FalseRefusalRatio = float64(rep.FalseRefusals) / float64(rep.Judged)
	}
	// The bounds, by the clients' own ledger.
	if where := rateExcess(l.rate150, 200, 100); where != "" {
		rep.Exceeded = append(rep.Exceeded, "rate of the user at 150 %: "+where)
	}
	l.mu.Lock()
	for token, c := range l.flight {
		if c.peak > 8 {
			rep.Exceeded = append(rep.Exceeded, fmt.Sprintf("in-flight of %s: %d at once, cap 8", token, c.peak))
		}
	}
	admitted := 0
	for _, a := range l.rate150 {
		if a.admitted {
			admitted++
		}
	}
	if c.Pushers {
		rep.Highest = append(rep.Highest, fmt.Sprintf("in-flight of push-flight-150: %d at once (cap 8)", l.flight["push-flight-150"].peak),
			fmt.Sprintf("in-flight of push-flight-90: %d at once (cap 8)", l.flight["push-flight-90"].peak),
			fmt.Sprintf("rate of push-rate-150: %d of %d admitted over the run (100/s, burst 200)", admitted, len(l.rate150)))
	}
	var refusedClients []string
	for u, n := range l.refusals {
		refusedClients = append(refusedClients, fmt.Sprintf("%s %d", u, n))
	}
	l.mu.Unlock()
	rep.ErrorSamples = append([]string{}, l.samples...)
	sort.Strings(refusedClients)
	if c.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return 2, err
		}
	} else {
		fmt.Fprintf(stdout, "cold mix, %d replicas, %d users, steady %.0f %% of the requests: %d requests in %.0f s (%.0f/s)\n",
			c.Replicas, c.Users, c.Steady*100, rep.Requests, rep.MeasuredSeconds, rep.RequestsPerSecond)
		fmt.Fprintf(stdout, "  the limits' server CPU per request: %.1f µs; statements per request: %.4f\n", rep.ServerCPUUsPerRequest, rep.StatementsPerRequest)
		fmt.Fprintf(stdout, "  false refusals: %d of %d judged requests (%.5f); errors %d %v; lost to the kill %d\n",
			rep.FalseRefusals, rep.Judged, rep.FalseRefusalRatio, rep.Errors, rep.ErrorSamples, rep.LostToTheKill)
		fmt.Fprintf(stdout, "  highest: %s\n", strings.Join(rep.Highest, "; "))
		fmt.Fprintf(stdout, "  exceeded: %v\n", rep.Exceeded)
		if len(refusedClients) > 0 {
			fmt.Fprintf(stdout, "  refused clients (all time): %s\n", strings.Join(refusedClients[:min(10, len(refusedClients))], ", "))
		}
	}
	if len(rep.Exceeded) > 0 || rep.FalseRefusals > 0 {
		return 1, nil
	}
	return 0, nil
}

// rateExcess finds, in the answers of one key, a run of admissions that
// breaks burst + rate × L for certain (requests i..j by send time were
// decided between the first's send and the last answer among them); ""
// when none is found.
func rateExcess(as []admission, burst int, rate float64) string {
	var adm []admission
	for _, a := range as {
		if a.admitted {
			adm = append(adm, a)
		}
	}
	sort.Slice(adm, func(i, j int) bool { return adm[i].sent.Before(adm[j].sent) })
	for i := range adm {
		last := adm[i].received
		for j := i; j < len(adm) && j < i+5000; j++ {
			if adm[j].received.After(last) {
				last = adm[j].received
			}
			span := last.Sub(adm[i].sent).Seconds()
			if n := j - i + 1; float64(n) > float64(burst)+rate*span {
				return fmt.Sprintf("%d admitted within %.3fs, at most %.1f allowed", n, span, float64(burst)+rate*span)
			}
		}
	}
	return ""
}
