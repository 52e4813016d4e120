package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// The loopback addresses of the run: the attacker and the user.
const (
	attackerIP = "127.0.0.3"
	userIP     = "127.0.0.4"
)

// Config is one run.
type Config struct {
	DatabaseURL     string
	Replicas        int
	Conns           int
	Dialers         int
	Baseline        time.Duration
	Attack          time.Duration
	UserRate        float64
	BodyTimeout     time.Duration
	MaxConnsPerPeer int
	MaxP50Ratio     float64
	MaxP99          time.Duration
	MaxHeld         time.Duration
	MaxRSSMB        float64
}

func defaultConfig() Config {
	return Config{Replicas: 2, Conns: 20_000, Dialers: 200, Baseline: 20 * time.Second, Attack: 90 * time.Second,
		UserRate: 20, BodyTimeout: 30 * time.Second, MaxConnsPerPeer: 64,
		MaxP50Ratio: 3, MaxP99: time.Second, MaxHeld: 65 * time.Second, MaxRSSMB: 200}
}

// maxOutstanding is how many of the user's requests may wait for their
// answers at once: half its history cap (-history-cap 4), so that none is
// refused by the user's own limits however slow the machine.
const maxOutstanding = 2

// Report is what a run measured.
type Report struct {
	Conns, MaxConnsPerPeer int
	BodyTimeout            time.Duration
	// The user's answers, before and during the attack.
	BaseN, AttackN       int
	BaseP50, BaseP99     time.Duration
	AttackP50, AttackP99 time.Duration
	Unanswered           int
	// Unanswers are the first distinct reasons of the unanswered (a status
	// and its problem type, or the client's error).
	Unanswers []string
	// Skipped are the user's ticks passed over because it already had
	// maxOutstanding requests waiting: a client that does not pile up
	// requests beyond its own caps (-history-cap 4 for the user's event
	// reads), which a slow (loaded) machine would refuse with a 429 of the
	// user's own limit, not the attack's doing.
	Skipped int
	// The attacker's connections.
	Opened, DialFailed, ClosedAtOnce, Held, HeldToEnd int
	LongestHeld                                       time.Duration
	// The attacked replica's resident memory.
	StartRSSMB, PeakRSSMB float64
}

// String is the report as the command prints it.
func (r *Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "edgecheck: %d slow connections from one address (%s) against one replica (-max-conns-per-peer %d, -body-timeout %v)\n",
		r.Conns, attackerIP, r.MaxConnsPerPeer, r.BodyTimeout)
	fmt.Fprintf(&b, "  another user (%s), GET /api/events?size=1:\n", userIP)
	fmt.Fprintf(&b, "    %-16s %6s %10s %10s\n", "phase", "n", "p50", "p99")
	fmt.Fprintf(&b, "    %-16s %6d %10v %10v\n", "unattacked", r.BaseN, r.BaseP50.Round(10*time.Microsecond), r.BaseP99.Round(10*time.Microsecond))
	fmt.Fprintf(&b, "    %-16s %6d %10v %10v\n", "under attack", r.AttackN, r.AttackP50.Round(10*time.Microsecond), r.AttackP99.Round(10*time.Microsecond))
	ratio := 0.0
	if r.BaseP50 > 0 {
		ratio = float64(r.AttackP50) / float64(r.BaseP50)
	}
	fmt.Fprintf(&b, "    p50 under attack / unattacked: %.2f×; unanswered: %d %v; ticks skipped with %d requests waiting: %d\n",
		ratio, r.Unanswered, r.Unanswers, maxOutstanding, r.Skipped)
	fmt.Fprintf(&b, "  the attacker: %d opened (%d could not connect), %d closed at once, %d held by the replica (%d still open when the attack ended), the longest held %v\n",
		r.Opened, r.DialFailed, r.ClosedAtOnce, r.Held, r.HeldToEnd, r.LongestHeld.Round(100*time.Millisecond))
	fmt.Fprintf(&b, "  the replica's resident memory: %.1f MB before, %.1f MB at its peak\n", r.StartRSSMB, r.PeakRSSMB)
	return b.String()
}

// Failures are the bounds the attack phase broke.
func (r *Report) Failures(c Config) []string {
	var f []string
	if r.BaseN == 0 || r.AttackN == 0 {
		f = append(f, "the user had no answers to judge")
	}
	if r.BaseP50 > 0 && float64(r.AttackP50) > c.MaxP50Ratio*float64(r.BaseP50) {
		f = append(f, fmt.Sprintf("p50 under attack %v is more than %.1f× the unattacked %v", r.AttackP50, c.MaxP50Ratio, r.BaseP50))
	}
	if r.AttackP99 >= c.MaxP99 {
		f = append(f, fmt.Sprintf("p99 under attack %v, want under %v", r.AttackP99, c.MaxP99))
	}
	if r.Unanswered > 0 {
		f = append(f, fmt.Sprintf("%d of the user's requests unanswered", r.Unanswered))
	}
	if r.HeldToEnd > 0 || r.LongestHeld > c.MaxHeld {
		f = append(f, fmt.Sprintf("a held connection was open %v (%d to the end), want each closed within %v", r.LongestHeld, r.HeldToEnd, c.MaxHeld))
	}
	if r.Held > c.MaxConnsPerPeer {
		f = append(f, fmt.Sprintf("%d connections of one address held, more than -max-conns-per-peer %d", r.Held, c.MaxConnsPerPeer))
	}
	if r.PeakRSSMB >= c.MaxRSSMB {
		f = append(f, fmt.Sprintf("the replica's memory peaked at %.1f MB, want under %.0f MB", r.PeakRSSMB, c.MaxRSSMB))
	}
	return f
}

// Run starts the database and the replicas, runs the baseline and the
// attack, and reports; progress lines go to progress.
func Run(ctx context.Context, c Config, progress io.Writer) (*Report, error) {
	if err := c.check(); err != nil {
		return nil, err
	}
	dbURL := c.DatabaseURL
	if dbURL == "" {
		fmt.Fprintln(progress, "edgecheck: no DATABASE_URL: starting an embedded PostgreSQL")
		startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
		cluster, err := embedpg.Start(startCtx, embedpg.Options{})
		cancel()
		if err != nil {
			return nil, fmt.Errorf("embedded PostgreSQL: %w", err)
		}
		defer func() { _ = cluster.Stop() }()
		dbURL = cluster.URL("postgres")
	}
	fmt.Fprintln(progress, "edgecheck: building cmd/studio")
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		return nil, err
	}
	defer replicaset.Cleanup()
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	procs, err := replicaset.Start(startCtx, replicaset.Options{Binary: bin, N: c.Replicas, DatabaseURL: dbURL,
		Args: []string{"-demo", "-max-conns-per-peer", strconv.Itoa(c.MaxConnsPerPeer), "-body-timeout", c.BodyTimeout.String(),
			"-ban-after", "20"}})
	cancel()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, p := range procs {
			p.Stop()
		}
	}()
	target := procs[0]
	rep := &Report{Conns: c.Conns, MaxConnsPerPeer: c.MaxConnsPerPeer, BodyTimeout: c.BodyTimeout}

	// The replica's memory, sampled throughout.
	var peakKB atomic.Int64
	rep.StartRSSMB = float64(rssKB(target.PID())) / 1024
	sampleCtx, stopSampling := context.WithCancel(ctx)
	defer stopSampling()
	go func() {
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			if kb := rssKB(target.PID()); kb > peakKB.Load() {
				peakKB.Store(kb)
			}
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
		}
	}()

	// The user reads throughout: the phase is stamped on each request.
	var (
		mu         sync.Mutex
		latencies  = map[string][]time.Duration{}
		unanswered atomic.Int64
		skipped    atomic.Int64
		waiting    atomic.Int64
		failures   []string
		phase      atomic.Value
		userWG     sync.WaitGroup
	)
	phase.Store("base")
	user := httpClientFrom(userIP)
	userCtx, stopUser := context.WithCancel(ctx)
	defer stopUser()
	userDone := make(chan struct{})
	go func() {
		defer close(userDone)
		t := time.NewTicker(time.Duration(float64(time.Second) / c.UserRate))
		defer t.Stop()
		for {
			select {
			case <-userCtx.Done():
				userWG.Wait()
				return
			case <-t.C:
			}
			ph := phase.Load().(string)
			if waiting.Load() >= maxOutstanding {
				skipped.Add(1)
				continue
			}
			waiting.Add(1)
			userWG.Add(1)
			go func() {
				defer userWG.Done()
				defer waiting.Add(-1)
				start := time.Now()
				req, _ := http.NewRequestWithContext(context.WithoutCancel(userCtx), http.MethodGet, target.URL+"/api/events?size=1", nil)
				req.Header.Set("Authorization", "Bearer bob-token")
				resp, err := user.Do(req)
				why := ""
				if err != nil {
					why = err.Error()
				} else {
					body, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						var problem struct{ Type string }
						_ = json.Unmarshal(body, &problem)
						why = fmt.Sprintf("%d %s", resp.StatusCode, problem.Type)
					}
				}
				if why != "" {
					unanswered.Add(1)
					mu.Lock()
					if len(failures) < 3 && !slices.Contains(failures, why) {
						failures = append(failures, why)
					}
					mu.Unlock()
					return
				}
				mu.Lock()
				latencies[ph] = append(latencies[ph], time.Since(start))
				mu.Unlock()
			}()
		}
	}()

	fmt.Fprintf(progress, "edgecheck: the user alone for %v\n", c.Baseline)
	if err := sleep(ctx, c.Baseline); err != nil {
		return nil, err
	}
	phase.Store("attack")
	fmt.Fprintf(progress, "edgecheck: %d slow connections from %s for %v\n", c.Conns, attackerIP, c.Attack)
	attackCtx, stopAttack := context.WithTimeout(ctx, c.Attack)
	defer stopAttack()
	a := &attacker{addr: target.Addr, started: time.Now()}
	a.run(attackCtx, c)
	<-attackCtx.Done()
	stopUser()
	<-userDone
	a.wait()
	stopSampling()

	rep.Opened, rep.DialFailed = int(a.opened.Load()), int(a.dialFailed.Load())
	rep.ClosedAtOnce, rep.Held, rep.HeldToEnd = int(a.closedAtOnce.Load()), int(a.held.Load()), int(a.heldToEnd.Load())
	rep.LongestHeld = time.Duration(a.longestHeld.Load())
	rep.PeakRSSMB = float64(peakKB.Load()) / 1024
	rep.Unanswered, rep.Skipped = int(unanswered.Load()), int(skipped.Load())
	mu.Lock()
	rep.Unanswers = slices.Clone(failures)
	mu.Unlock()
	rep.BaseN, rep.BaseP50, rep.BaseP99 = quantiles(latencies["base"])
	rep.AttackN, rep.AttackP50, rep.AttackP99 = quantiles(latencies["attack"])
	return rep, nil
}

// attacker opens the slow connections and follows each.
type attacker struct {
	addr    string
	started time.Time
	wg      sync.WaitGroup

	opened, dialFailed, closedAtOnce, held, heldToEnd atomic.Int64
	longestHeld                                       atomic.Int64
}

// run opens c.Conns connections, c.Dialers at a time, until they are all
// opened or ctx ends; a connection the replica holds is followed by a
// goroutine of its own until the replica closes it or ctx ends.
func (a *attacker) run(ctx context.Context, c Config) {
	jobs := make(chan int)
	go func() {
		defer close(jobs)
		for i := range c.Conns {
			select {
			case jobs <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range c.Dialers {
		a.wg.Go(func() {
			for i := range jobs {
				a.one(ctx, i)
			}
		})
	}
}

func (a *attacker) wait() { a.wg.Wait() }

// one opens connection i: the headers of a POST /limits or /audit with a
// body of 4000 bytes, and its first byte. Closed by the replica within a
// second: closed at once. Otherwise held: a byte every 8 s until the
// replica closes it.
func (a *attacker) one(ctx context.Context, i int) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(attackerIP)}, Timeout: 5 * time.Second}
	conn, err := d.DialContext(ctx, "tcp", a.addr)
	if err != nil {
		if ctx.Err() == nil {
			a.dialFailed.Add(1)
		}
		return
	}
	opened := time.Now()
	a.opened.Add(1)
	path := "/limits"
	if i%2 == 1 {
		path = "/audit"
	}
	_, _ = fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: studio\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 4000\r\n\r\nt", path)
	closed := make(chan struct{})
	go func() {
		// The replica's answers are read and dropped; EOF or an error is
		// the connection closed.
		_, _ = io.Copy(io.Discard, bufio.NewReader(conn))
		close(closed)
	}()
	select {
	case <-closed:
		a.closedAtOnce.Add(1)
		conn.Close()
		return
	case <-time.After(time.Second):
	case <-ctx.Done():
		conn.Close()
		<-closed
		return
	}
	a.held.Add(1)
	a.wg.Go(func() {
		defer conn.Close()
		tick := time.NewTicker(8 * time.Second)
		defer tick.Stop()
		for {
			select {
			case <-closed:
				took := int64(time.Since(opened))
				for {
					old := a.longestHeld.Load()
					if took <= old || a.longestHeld.CompareAndSwap(old, took) {
						break
					}
				}
				return
			case <-ctx.Done():
				a.heldToEnd.Add(1)
				conn.Close()
				<-closed
				return
			case <-tick.C:
				_, _ = conn.Write([]byte("t"))
			}
		}
	})
}

// httpClientFrom is a client whose connections leave from local.
func httpClientFrom(local string) *http.Client {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64}}
}

// rssKB is the resident memory of process pid in kB (VmRSS), 0 when it
// cannot be read.
func rssKB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// quantiles are the count, p50 and p99 of d.
func quantiles(d []time.Duration) (int, time.Duration, time.Duration) {
	if len(d) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return len(s), at(0.50), at(0.99)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}
