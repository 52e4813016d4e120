package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime/multipart"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/fakenode"
	"github.com/pglimit/pglimit/internal/harness/citustest"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// Config is one load check: the limits the replicas are started with (and
// judged against), the load and its length.
type Config struct {
	// DatabaseURL is the primary the replicas share; "" starts an embedded
	// throwaway PostgreSQL (a Citus cluster with Citus). On a Citus
	// coordinator the observer watches the workers too (pg_dist_node).
	DatabaseURL string
	// Citus, when DatabaseURL is "", starts a throwaway Citus cluster of a
	// coordinator and two workers (internal/harness/citustest) instead of one
	// server: the replicas share the coordinator.
	Citus bool
	// Replicas is the number of cmd/studio processes.
	Replicas int
	// Duration is how long the load runs (after the warm-up).
	Duration time.Duration
	// Studio is a built cmd/studio binary; "" builds one.
	Studio string
	// LogDir keeps the replicas' and the database's logs; "" makes a
	// temporary directory, removed after a run that passed unless KeepLogs.
	LogDir   string
	KeepLogs bool
	// Progress receives a line of live progress every ProgressEvery.
	Progress      io.Writer
	ProgressEvery time.Duration

	// The limits, as cmd/studio's flags of the same names.
	SQLConsoleCap  int
	PoolMaxConns   int
	SignInFailures int
	SignInWindow   time.Duration
	SignInStrict   bool
	UploadsPerHour int
	UploadWindow   time.Duration
	TokenInFlight  int
	NodeRate       int
	// APIRate (requests per second per user, all its tokens together) and APIBurst are
	// cmd/studio's -api-rate and -api-burst.
	APIRate  int
	APIBurst int
	// APIBorrow is cmd/studio's -api-borrow: the rate's over-grants are
	// judged as without it; its refusals with room are the price of
	// borrowing (units another replica holds) and are reported, not judged.
	APIBorrow bool
	// AddressRate (requests per second per client address) and
	// AddressBurst are cmd/studio's -address-rate and -address-burst,
	// driven by AddressWorkers loops of requests without a token from
	// Addresses client addresses, forwarded by the stand-in proxy
	// 127.0.0.2 the replicas trust (-trusted-proxies). AddressBurst is
	// at least the sign-in round's requests (2 × SignInFailures + 2): each
	// round comes from a fresh address of its own.
	AddressRate, AddressBurst, AddressWorkers, Addresses int
	// TokenInFlightKeep is cmd/studio's -token-in-flight-keep: replicas
	// keep a token's slot after its request (inflight.Options.Keep). Every
	// token of the load moves to another replica on each request (the
	// replicas are taken in turn), the case kept slots serve worst: the
	// in-flight cap is judged as without it; its refusals with room (a
	// slot kept idle on another replica, not given back within the
	// refused request's wait) are counted, and named in the row's note.
	TokenInFlightKeep time.Duration
	// BanAfter, BanWithin and BanFor are cmd/studio's -ban-after,
	// -ban-within and -ban-for: a user or client address the rate limits
	// refused BanAfter times within BanWithin is refused (429 banned) on
	// every replica for BanFor. 0 (the default): no bans. The load's rate
	// and address loops are refused often enough to be banned; so are the
	// console's users, whose heavy limits the load then reaches less
	// often (TestLoadCheckBans judges the bans and the rates, not reach).
	BanAfter          int
	BanWithin, BanFor time.Duration

	// Queues is the fake node's number of queues (a queue listing is one
	// search call and one read call per 200 queues).
	Queues int
	// ConsoleSleep is how long each console statement sleeps.
	ConsoleSleep time.Duration
	// TokensPerUser and WorkersPerToken shape the console load: each user
	// runs WorkersPerToken loops on each of TokensPerUser tokens.
	TokensPerUser, WorkersPerToken int
	// RateWorkers loops drive one token of their own above its rate.
	RateWorkers int
	// NodeWorkers loops per replica list the node's queues, on tokens of
	// TokenInFlight loops each. The node rate is reached only while every
	// replica has a call waiting at its share; each listing also spends
	// its own database decisions (token, in-flight, rate) outside the
	// gate, which take a second or more on a loaded machine, so
	// TokenInFlight loops alone leave the gate idle and the rate unreached.
	NodeWorkers int
	// Pause is how long a loop waits after a refusal before it tries again.
	Pause time.Duration
	// Slack is added to the end of every request when false refusals are
	// judged (a slot may be released just after the client read the answer).
	Slack time.Duration
	// NodeDelivery is the longest a call to the node takes from its turn
	// (the node limiter's Wait) to the node, which stamps it when the
	// kernel received it: the replica's own sending of it. The node rate
	// is judged as burst + rate × (L + NodeDelivery) in any interval L.
	NodeDelivery time.Duration
	// WarmupTimeout bounds the wait for every replica to take its share
	// of the node rate.
	WarmupTimeout time.Duration

	// studioOverride are flags given to the replicas after the judged
	// ones: the tests use it to start replicas with looser limits than
	// the check judges, to prove the check sees an excess.
	studioOverride []string
}

// DefaultConfig is what `make loadcheck` runs.
func DefaultConfig() Config {
	return Config{
		Replicas: 3, Duration: 30 * time.Second, ProgressEvery: time.Second,
		SQLConsoleCap: 2, PoolMaxConns: 16, SignInFailures: 3, SignInWindow: 10 * time.Minute, SignInStrict: true,
		UploadsPerHour: 3, UploadWindow: 5 * time.Second, TokenInFlight: 2, NodeRate: 6,
		APIRate: 20, APIBurst: 10, AddressRate: 10, AddressBurst: 10, AddressWorkers: 6, Addresses: 2,
		Queues: 450, ConsoleSleep: 200 * time.Millisecond, TokensPerUser: 2, WorkersPerToken: 3, RateWorkers: 6, NodeWorkers: 4,
		Pause: 50 * time.Millisecond, Slack: 25 * time.Millisecond, WarmupTimeout: 40 * time.Second,
		NodeDelivery: 100 * time.Millisecond,
	}
}

func (c *Config) validate() error {
	var errs []error
	atLeast := func(name string, v, lo int) {
		if v < lo {
			errs = append(errs, fmt.Errorf("-%s must be at least %d", name, lo))
		}
	}
	atLeast("replicas", c.Replicas, 1)
	atLeast("sql-console-cap", c.SQLConsoleCap, 1)
	atLeast("pool-max-conns", c.PoolMaxConns, 1)
	atLeast("sign-in-failures", c.SignInFailures, 1)
	atLeast("uploads-per-hour", c.UploadsPerHour, 1)
	atLeast("token-in-flight", c.TokenInFlight, 1)
	atLeast("node-rate", c.NodeRate, 1)
	atLeast("queues", c.Queues, 1)
	atLeast("tokens-per-user", c.TokensPerUser, 1)
	atLeast("workers-per-token", c.WorkersPerToken, 1)
	atLeast("api-rate", c.APIRate, 1)
	atLeast("api-burst", c.APIBurst, 1)
	atLeast("rate-workers", c.RateWorkers, 1)
	atLeast("address-rate", c.AddressRate, 1)
	atLeast("address-burst", c.AddressBurst, 2*c.SignInFailures+2)
	atLeast("address-workers", c.AddressWorkers, 1)
	atLeast("addresses", c.Addresses, 1)
	atLeast("ban-after", c.BanAfter, 0)
	if c.BanAfter > 0 && (c.BanWithin < 100*time.Millisecond || c.BanFor < 100*time.Millisecond) {
		errs = append(errs, fmt.Errorf("-ban-within and -ban-for: at least 100ms when -ban-after is set (got %v and %v)", c.BanWithin, c.BanFor))
	}
	atLeast("node-workers", c.NodeWorkers, 1)
	if c.Replicas > 16 {
		errs = append(errs, errors.New("-replicas must be at most 16"))
	}
	if c.Duration < time.Second || c.Duration > 10*time.Minute {
		errs = append(errs, errors.New("-duration must be from 1s to 10m"))
	}
	// A sign-in round lasts well under a second; a window this long holds
	// each round's failures, so counting them per username is per window.
	if c.SignInWindow < 10*time.Second {
		errs = append(errs, errors.New("-sign-in-window must be at least 10s"))
	}
	if c.UploadWindow < time.Second {
		errs = append(errs, errors.New("-upload-window must be at least 1s"))
	}
	if c.ConsoleSleep < 10*time.Millisecond || c.ConsoleSleep > 10*time.Second {
		errs = append(errs, errors.New("-console-sleep must be from 10ms to 10s"))
	}
	if c.Pause < 0 || c.Slack < 0 || c.NodeDelivery < 0 || c.WarmupTimeout <= 0 || c.ProgressEvery < 0 {
		errs = append(errs, errors.New("-pause, -slack, -node-delivery must not be negative and -warmup-timeout must be positive"))
	}
	return errors.Join(errs...)
}

// installationCap is cmd/studio's installation-wide heavy cap.
func (c *Config) installationCap() int { return max(1, c.PoolMaxConns/4) }

// proxyIP is the loopback address the load's stand-in proxy sends from;
// the replicas trust it (-trusted-proxies).
const proxyIP = "127.0.0.2"

// nodeShare is each replica's part of the node rate: ceil(rate / replicas).
func (c *Config) nodeShare() int { return (c.NodeRate + c.Replicas - 1) / c.Replicas }

var users = []string{"alice", "bob", "carol"}

// loadRun is one run in progress.
type loadRun struct {
	cfg    Config
	run    string // the run's id, in markers and probe usernames
	marker string
	procs  []*replicaset.Proc
	client *http.Client
	// proxy sends from 127.0.0.2, the proxy the replicas trust: the
	// requests that claim a client address (record.addr).
	proxy *http.Client
	t0    time.Time

	mu     sync.Mutex
	ledger []record

	next                                atomic.Uint64 // round-robin over replicas
	consoleOK, consoleRefused           atomic.Int64
	signFailed, signRefused, signRounds atomic.Int64
	setupSignIns                        atomic.Int64 // the setup's sign-ins (signIn), each from its own address
	uploadOK, uploadRefused, nodeOK     atomic.Int64
	rateOK, rateRefused                 atomic.Int64
	addressOK, addressRefused           atomic.Int64
	unexpected                          atomic.Int64
}

// Run runs a load check and returns its report. An error means the check
// could not be run (or judged); a report whose Exceeded is true means a
// limit did not hold.
func Run(ctx context.Context, cfg Config) (rep *Report, err error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if cfg.Progress == nil {
		cfg.Progress = io.Discard
	}
	ownLogs := cfg.LogDir == ""
	if ownLogs {
		if cfg.LogDir, err = os.MkdirTemp("", "pglimit-loadcheck-"); err != nil {
			return nil, err
		}
	} else if err := os.MkdirAll(cfg.LogDir, 0o755); err != nil {
		return nil, err
	}
	passed := false
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\nlogs of the replicas and the database: %s", err, cfg.LogDir)
			return
		}
		if passed && ownLogs && !cfg.KeepLogs {
			_ = os.RemoveAll(cfg.LogDir)
			if rep != nil {
				rep.LogDir = ""
			}
		}
	}()

	id := make([]byte, 4)
	_, _ = rand.Read(id)
	lr := &loadRun{cfg: cfg, run: hex.EncodeToString(id)}
	lr.marker = "lc-" + lr.run + ":"
	lr.client = &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute},
	}
	defer lr.client.CloseIdleConnections()
	proxyDialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(proxyIP)}, Timeout: 10 * time.Second}
	lr.proxy = &http.Client{
		Timeout:   60 * time.Second,
		Transport: &http.Transport{DialContext: proxyDialer.DialContext, MaxIdleConns: 256, MaxIdleConnsPerHost: 64, IdleConnTimeout: time.Minute},
	}
	defer lr.proxy.CloseIdleConnections()

	dbURL := cfg.DatabaseURL
	if dbURL == "" {
		logf, err := os.Create(filepath.Join(cfg.LogDir, "postgres.log"))
		if err != nil {
			return nil, err
		}
		defer logf.Close()
		// stop is the throwaway server's, or cluster's.
		var stop func() error
		if cfg.Citus {
			if ok, line := citustest.Installed(); !ok {
				return nil, errors.New(line)
			}
			fmt.Fprintln(cfg.Progress, "loadcheck: starting a Citus cluster (a coordinator and two workers)")
			startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
			cluster, err := citustest.Start(startCtx, citustest.Options{Log: logf})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("citus: %w", err)
			}
			stop, dbURL = cluster.Stop, cluster.URL("postgres")
		} else {
			fmt.Fprintln(cfg.Progress, "loadcheck: no DATABASE_URL: starting an embedded PostgreSQL")
			startCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
			cluster, err := embedpg.Start(startCtx, embedpg.Options{Log: logf})
			cancel()
			if err != nil {
				return nil, fmt.Errorf("embedded PostgreSQL: %w", err)
			}
			stop, dbURL = cluster.Stop, cluster.URL("postgres")
		}
		defer func() { _ = stop() }()
	}

	node, err := fakenode.New(fakenode.Options{Queues: cfg.Queues, Broker: "loadcheck"})
	if err != nil {
		return nil, err
	}
	ln, err := fakenode.Listen("127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	nodeSrv := &http.Server{Handler: node, ConnContext: fakenode.ConnContext, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = nodeSrv.Serve(ln) }()
	defer nodeSrv.Close()

	bin := cfg.Studio
	if bin == "" {
		fmt.Fprintln(cfg.Progress, "loadcheck: building cmd/studio")
		if bin, err = replicaset.Build("github.com/pglimit/pglimit/cmd/studio"); err != nil {
			return nil, err
		}
		defer replicaset.Cleanup()
	}
	args := []string{"-demo",
		"-sql-console-cap", strconv.Itoa(cfg.SQLConsoleCap),
		"-pool-max-conns", strconv.Itoa(cfg.PoolMaxConns),
		"-sign-in-failures", strconv.Itoa(cfg.SignInFailures),
		"-sign-in-window", cfg.SignInWindow.String(),
		"-sign-in-strict=" + strconv.FormatBool(cfg.SignInStrict),
		"-uploads-per-hour", strconv.Itoa(cfg.UploadsPerHour),
		"-upload-window", cfg.UploadWindow.String(),
		"-token-in-flight", strconv.Itoa(cfg.TokenInFlight),
		"-token-in-flight-keep", cfg.TokenInFlightKeep.String(),
		"-node", "b1=http://" + ln.Addr().String(),
		"-node-rate", strconv.Itoa(cfg.NodeRate),
		"-api-rate", strconv.Itoa(cfg.APIRate) + "/s",
		"-api-burst", strconv.Itoa(cfg.APIBurst),
		"-api-borrow=" + strconv.FormatBool(cfg.APIBorrow),
		// Requests without a token claim a client address through the
		// stand-in proxy: the address load's few addresses, and a fresh
		// one for each sign-in round, whose burst fits in -address-burst.
		// The failed sign-ins per address (-sign-in-address-failures) are
		// not judged here (cmd/studio's spray tests do).
		"-trusted-proxies", proxyIP + "/32",
		"-address-rate", strconv.Itoa(cfg.AddressRate) + "/s",
		"-address-burst", strconv.Itoa(cfg.AddressBurst),
		"-sign-in-address-failures", "0",
		// The registry's heartbeat: a row lapses three intervals after its
		// last heartbeat, and a heartbeat is bounded by the interval. At
		// 500ms, on a Citus cluster beside a CPU hog per core, two
		// heartbeats in a row took longer than that: the replicas counted
		// 2 ready of 3 for a moment and the node saw 9 calls in a second of
		// 6 (what a replica lost for real does, which is not what this
		// check judges). At 2s the warm-up still sees every replica within
		// a few seconds.
		"-heartbeat", "2s",
	}
	if cfg.BanAfter > 0 {
		args = append(args, "-ban-after", strconv.Itoa(cfg.BanAfter), "-ban-within", cfg.BanWithin.String(), "-ban-for", cfg.BanFor.String())
	}
	args = append(args, cfg.studioOverride...)
	fmt.Fprintf(cfg.Progress, "loadcheck: starting %d replicas of cmd/studio (logs in %s)\n", cfg.Replicas, cfg.LogDir)
	startCtx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	lr.procs, err = replicaset.Start(startCtx, replicaset.Options{
		Binary: bin, N: cfg.Replicas, DatabaseURL: dbURL, Args: args, LogDir: cfg.LogDir,
	})
	cancel()
	if err != nil {
		return nil, err
	}
	defer func() {
		for _, p := range lr.procs {
			p.Stop()
		}
	}()

	tokens, err := lr.tokens(ctx)
	if err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "loadcheck: waiting until every replica takes its share of the node rate (%d/s of %d/s)\n", cfg.nodeShare(), cfg.NodeRate)
	if err := lr.warmUp(ctx, tokens.node[0][0]); err != nil {
		return nil, err
	}
	fmt.Fprintf(cfg.Progress, "loadcheck: opening every replica's pool (%d connections each)\n", cfg.PoolMaxConns)
	if err := lr.warmPools(ctx); err != nil {
		return nil, err
	}

	obs, err := newObserver(ctx, dbURL, lr.marker)
	if err != nil {
		return nil, fmt.Errorf("observer: %w", err)
	}
	var bans *banObserver
	if cfg.BanAfter > 0 {
		if bans, err = newBanObserver(ctx, dbURL); err != nil {
			obs.close()
			return nil, fmt.Errorf("ban observer: %w", err)
		}
	}
	obsCtx, stopObs := context.WithCancel(ctx)
	obsErr := make(chan error, 2)
	go func() { obsErr <- obs.run(obsCtx) }()

	fmt.Fprintf(cfg.Progress, "loadcheck: load for %v\n", cfg.Duration)
	node.Reset()
	lr.t0 = time.Now()
	if bans != nil {
		go func() { obsErr <- bans.run(obsCtx, lr.t0) }()
	}
	deadline := lr.t0.Add(cfg.Duration)
	loadCtx, stopLoad := context.WithDeadline(ctx, deadline)
	// Requests already sent when the load stops finish (each is bounded by
	// the client's time-out); none is sent after the deadline.
	var wg sync.WaitGroup
	lr.startLoad(loadCtx, &wg, tokens)
	progressDone := make(chan struct{})
	go func() { lr.progress(loadCtx, obs, node); close(progressDone) }()
	wg.Wait()
	stopLoad()
	<-progressDone
	stopObs()
	if err := <-obsErr; err != nil {
		return nil, fmt.Errorf("observer: %w", err)
	}
	if bans != nil {
		if err := <-obsErr; err != nil {
			return nil, fmt.Errorf("observer: %w", err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rep = lr.judge(obs.peaks(), node, deadline)
	if bans != nil {
		lr.judgeBanRow(rep, bans)
	}
	rep.LogDir = cfg.LogDir
	passed = !rep.Failed()
	return rep, nil
}

// tokenSet are the API tokens of the load, each a separate in-flight scope.
type tokenSet struct {
	console map[string][]labelled // per user
	upload  map[string]labelled   // per user
	node    [][]labelled          // per replica, each token TokenInFlight loops
	rate    labelled              // the rate load's own
}

type labelled struct{ label, user, token string }

// tokens signs in for the session tokens the load needs beside the demo
// tokens: console load runs on alice-token, bob-token, carol-token and
// TokensPerUser-1 session tokens per user; uploads, node reads and the
// rate load have tokens of their own so that their requests in flight (and
// the rate load's rate) do not take the console's.
func (lr *loadRun) tokens(ctx context.Context) (*tokenSet, error) {
	ts := &tokenSet{console: map[string][]labelled{}, upload: map[string]labelled{}}
	for _, u := range users {
		ts.console[u] = append(ts.console[u], labelled{u + "-t1", u, u + "-token"})
		for i := 2; i <= lr.cfg.TokensPerUser; i++ {
			tok, err := lr.signIn(ctx, u)
			if err != nil {
				return nil, err
			}
			ts.console[u] = append(ts.console[u], labelled{fmt.Sprintf("%s-t%d", u, i), u, tok})
		}
		tok, err := lr.signIn(ctx, u)
		if err != nil {
			return nil, err
		}
		ts.upload[u] = labelled{u + "-upload", u, tok}
	}
	perToken := lr.cfg.TokenInFlight
	for i := range lr.procs {
		var toks []labelled
		for j := range (lr.cfg.NodeWorkers + perToken - 1) / perToken {
			tok, err := lr.signIn(ctx, "bob")
			if err != nil {
				return nil, err
			}
			toks = append(toks, labelled{fmt.Sprintf("node-%d-t%d", i+1, j+1), "bob", tok})
		}
		ts.node = append(ts.node, toks)
	}
	tok, err := lr.signIn(ctx, "alice") // an operator: GET /api/limits answers 200
	if err != nil {
		return nil, err
	}
	ts.rate = labelled{"rate", "alice", tok}
	return ts, nil
}

// signIn signs user in for a token of the load, through the stand-in
// proxy from a client address of its own (192.0.2.n, never one the load
// judges): the setup's dozen sign-ins at once must not spend a client
// address's rate (-address-rate, 4/s in the short run, burst 10), which
// refused the last of them when they were answered quickly.
func (lr *loadRun) signIn(ctx context.Context, user string) (string, error) {
	body, _ := json.Marshal(map[string]string{"username": user, "password": "studio"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, lr.procs[0].URL+"/api/session", bytes.NewReader(body))
	if err != nil {
		return "", err
	}
	req.Header.Set("Content-Type", "application/json")
	n := lr.setupSignIns.Add(1)
	req.Header.Set("X-Forwarded-For", fmt.Sprintf("192.0.%d.%d", 2+n>>8&255, n&255))
	resp, err := lr.proxy.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var out struct {
		Token string `json:"token"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != 200 || out.Token == "" {
		return "", fmt.Errorf("sign-in of %s: status %d, %v", user, resp.StatusCode, err)
	}
	return out.Token, nil
}

// warmUp waits until every replica answers a queue listing with
// readyReplicas equal to the number of replicas and rate.replica equal to
// its share of the node's rate, ceil(rate.installation / replicas): each
// replica re-reads the ready count at most every 5 s, and judging the node
// rate before all of them divide by the same count would judge the
// start-up, not the limit.
func (lr *loadRun) warmUp(ctx context.Context, tok labelled) error {
	deadline := time.Now().Add(lr.cfg.WarmupTimeout)
	n := len(lr.procs)
	for _, p := range lr.procs {
		for {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.URL+"/api/nodes/b1/queues", nil)
			if err != nil {
				return err
			}
			req.Header.Set("Authorization", "Bearer "+tok.token)
			var got struct {
				Rate struct {
					Installation  float64 `json:"installation"`
					Replica       float64 `json:"replica"`
					ReadyReplicas int     `json:"readyReplicas"`
				} `json:"rate"`
			}
			resp, err := lr.client.Do(req)
			status := 0
			if err == nil {
				status = resp.StatusCode
				_ = json.NewDecoder(resp.Body).Decode(&got)
				resp.Body.Close()
			}
			want := math.Ceil(got.Rate.Installation / float64(n))
			if status == 200 && got.Rate.ReadyReplicas == n && got.Rate.Replica == want {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("%s did not take its share of the node rate within %v: last answer %d, rate %+v, %v",
					p.Name, lr.cfg.WarmupTimeout, status, got.Rate, err)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(250 * time.Millisecond):
			}
		}
	}
	return nil
}

// warmPools sends every replica bursts of -pool-max-conns concurrent
// sign-ins (wrong passwords for usernames of their own, which no judged
// limit counts) until a burst is answered without a 503, at most for
// WarmupTimeout. A replica's pool opens its connections as requests need
// them: without this, the load's first second makes every pool open a
// dozen at once, and on a loaded machine a decision that waits for a new
// connection (a backend forked and authenticated, on Citus one more to a
// worker on its first statement there) outlasts the service's 5 s bound:
// a 503 of the start-up, not of the limits the check judges.
func (lr *loadRun) warmPools(ctx context.Context) error {
	deadline := time.Now().Add(lr.cfg.WarmupTimeout)
	body := func(i int) []byte {
		b, _ := json.Marshal(map[string]string{"username": fmt.Sprintf("lc-%s-warm-%d", lr.run, i), "password": "wrong"})
		return b
	}
	n := 0
	for round := 1; ; round++ {
		var failed atomic.Int64
		var wg sync.WaitGroup
		for _, p := range lr.procs {
			for range lr.cfg.PoolMaxConns {
				n++
				b := body(n)
				wg.Add(1)
				go func() {
					defer wg.Done()
					req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.URL+"/api/session", bytes.NewReader(b))
					if err != nil {
						failed.Add(1)
						return
					}
					req.Header.Set("Content-Type", "application/json")
					resp, err := lr.client.Do(req)
					if err != nil {
						failed.Add(1)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode >= 500 {
						failed.Add(1)
					}
				}()
			}
		}
		wg.Wait()
		if err := ctx.Err(); err != nil {
			return err
		}
		if failed.Load() == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the replicas still failed %d of %d sign-ins at once after %d rounds in %v", failed.Load(), len(lr.procs)*lr.cfg.PoolMaxConns, round, lr.cfg.WarmupTimeout)
		}
		fmt.Fprintf(lr.cfg.Progress, "loadcheck: round %d of the pools' warm-up: %d failed; again\n", round, failed.Load())
	}
}

func (lr *loadRun) replica() *replicaset.Proc {
	return lr.procs[int(lr.next.Add(1)-1)%len(lr.procs)]
}

func (lr *loadRun) add(r record) {
	if !r.expected() {
		lr.unexpected.Add(1)
	}
	lr.mu.Lock()
	lr.ledger = append(lr.ledger, r)
	lr.mu.Unlock()
}

// startLoad starts every loop; each stops when ctx ends.
func (lr *loadRun) startLoad(ctx context.Context, wg *sync.WaitGroup, ts *tokenSet) {
	loop := func(f func()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				f()
			}
		}()
	}
	pause := func() {
		select {
		case <-ctx.Done():
		case <-time.After(lr.cfg.Pause):
		}
	}
	for _, u := range users {
		for _, tok := range ts.console[u] {
			sql := fmt.Sprintf("SELECT pg_sleep(%g), '%s%s:%s'", lr.cfg.ConsoleSleep.Seconds(), lr.marker, u, tok.label)
			body, _ := json.Marshal(map[string]string{"sql": sql})
			for range lr.cfg.WorkersPerToken {
				loop(func() {
					r := lr.do(ctx, record{kind: kindConsole, user: u, token: tok.label}, http.MethodPost, "/api/sql", tok.token, "application/json", body)
					if r.status == 200 {
						lr.consoleOK.Add(1)
						return
					}
					lr.consoleRefused.Add(1)
					pause()
				})
			}
		}
		tok := ts.upload[u]
		for i := range lr.cfg.TokenInFlight {
			// Every upload's content differs: the service refuses a plugin
			// already stored (409 duplicate-plugin), which is not a limit.
			var sent int
			loop(func() {
				sent++
				body, ctype := plugin(fmt.Sprintf("lc-%s-%s-%d-%d.jar", lr.run, u, i, sent))
				r := lr.do(ctx, record{kind: kindUpload, user: u, token: tok.label}, http.MethodPost, "/api/plugins", tok.token, ctype, body)
				if r.status == 201 {
					lr.uploadOK.Add(1)
					return
				}
				lr.uploadRefused.Add(1)
				pause()
			})
		}
	}
	for i, toks := range ts.node {
		p := lr.procs[i]
		for w := range lr.cfg.NodeWorkers {
			tok := toks[w/lr.cfg.TokenInFlight]
			loop(func() {
				r := lr.doOn(ctx, p, record{kind: kindNode, user: tok.user, token: tok.label}, http.MethodGet, "/api/nodes/b1/queues", tok.token, "", nil)
				if r.status == 200 {
					lr.nodeOK.Add(1)
					return
				}
				pause()
			})
		}
	}
	for range lr.cfg.RateWorkers {
		loop(func() {
			r := lr.do(ctx, record{kind: kindRate, user: ts.rate.user, token: ts.rate.label}, http.MethodGet, "/api/limits", ts.rate.token, "", nil)
			if r.refusedBy(slugRate) || r.refusedBy(slugBanned) {
				lr.rateRefused.Add(1)
				pause()
				return
			}
			lr.rateOK.Add(1)
		})
	}
	for w := range lr.cfg.AddressWorkers {
		addr := fmt.Sprintf("192.0.2.%d", w%lr.cfg.Addresses+1)
		loop(func() {
			r := lr.do(ctx, record{kind: kindAddress, addr: addr}, http.MethodGet, "/api/audit", "", "", nil)
			if r.refusedBy(slugRate) || r.refusedBy(slugBanned) {
				lr.addressRefused.Add(1)
				pause()
				return
			}
			lr.addressOK.Add(1)
		})
	}
	loop(func() { lr.signInRound(ctx) })
}

// signInRound tries wrong passwords for a fresh username, 2×limit+2 at
// once spread over the replicas, and waits for every answer.
func (lr *loadRun) signInRound(ctx context.Context) {
	k := lr.signRounds.Add(1)
	username := fmt.Sprintf("lc-%s-%d", lr.run, k)
	addr := fmt.Sprintf("10.%d.%d.%d", k>>16&255, k>>8&255, k&255) // the round's own client address
	body, _ := json.Marshal(map[string]string{"username": username, "password": "wrong"})
	var wg sync.WaitGroup
	for range 2*lr.cfg.SignInFailures + 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := lr.do(ctx, record{kind: kindSignIn, key: username, addr: addr}, http.MethodPost, "/api/session", "", "application/json", body)
			switch {
			case r.status == 401:
				lr.signFailed.Add(1)
			case r.status == 429:
				lr.signRefused.Add(1)
			}
		}()
	}
	wg.Wait()
	select {
	case <-ctx.Done():
	case <-time.After(100 * time.Millisecond):
	}
}

// plugin is a small multipart upload.
func plugin(name string) ([]byte, string) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	fw, _ := mw.CreateFormFile("file", name)
	_, _ = fw.Write([]byte("load check plugin " + name))
	_ = mw.Close()
	return b.Bytes(), mw.FormDataContentType()
}

func (lr *loadRun) do(ctx context.Context, r record, method, path, token, ctype string, body []byte) record {
	return lr.doOn(ctx, lr.replica(), r, method, path, token, ctype, body)
}

// doOn sends one request to p, reads the whole answer, and enters it in
// the ledger. A request the load's end cut short is not entered: it was
// never answered, and the client stopped it, not the service.
func (lr *loadRun) doOn(ctx context.Context, p *replicaset.Proc, r record, method, path, token, ctype string, body []byte) record {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	// The request outlives the load's deadline: one sent before it is
	// answered, so that the ledger holds every slot taken.
	req, err := http.NewRequestWithContext(context.WithoutCancel(ctx), method, p.URL+path, rd)
	if err != nil {
		r.err = err
		return r
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	client := lr.client
	if r.addr != "" {
		client = lr.proxy
		req.Header.Set("X-Forwarded-For", r.addr)
	}
	r.start = time.Since(lr.t0)
	resp, err := client.Do(req)
	if err != nil {
		r.err, r.end = err, never
		lr.add(r)
		return r
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.end = time.Since(lr.t0)
	r.status = resp.StatusCode
	if err != nil {
		r.err, r.end = err, never
	}
	r.rateHeaders = hasRateHeaders(resp.Header, "api")
	r.addressHeaders = hasRateHeaders(resp.Header, "address")
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "application/problem+json") {
		var p struct {
			Type  string `json:"type"`
			Scope string `json:"scope"`
		}
		_ = json.Unmarshal(data, &p)
		r.slug = p.Type[strings.LastIndexAny(p.Type, ":/")+1:]
		r.scope = p.Scope
	}
	if r.kind == kindNode && r.status == 200 {
		var q struct {
			Rate struct {
				Replica       float64 `json:"replica"`
				ReadyReplicas int     `json:"readyReplicas"`
			} `json:"rate"`
		}
		_ = json.Unmarshal(data, &q)
		r.share, r.ready = q.Rate.Replica, q.Rate.ReadyReplicas
	}
	lr.add(r)
	return r
}

// progress prints a line every ProgressEvery until ctx ends.
func (lr *loadRun) progress(ctx context.Context, obs *observer, node *fakenode.Node) {
	if lr.cfg.ProgressEvery <= 0 {
		<-ctx.Done()
		return
	}
	t := time.NewTicker(lr.cfg.ProgressEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pk := obs.peaks()
		st := node.Stats()
		last := 0
		if n := len(st.PerSecond); n > 1 {
			last = st.PerSecond[n-2].Calls // the last complete second
		}
		fmt.Fprintf(lr.cfg.Progress,
			"%5.0fs  console %d ok %d refused, running peak user %d/%d inst %d/%d token %d/%d | sign-in rounds %d: %d×401 %d×429 | uploads %d×201 %d×429 | node %d calls, %d last s (%d/s) | rate %d passed %d×429 | address %d passed %d×429 | unexpected %d\n",
			time.Since(lr.t0).Seconds(), lr.consoleOK.Load(), lr.consoleRefused.Load(),
			pk.User, lr.cfg.SQLConsoleCap, pk.Installation, lr.cfg.installationCap(), pk.Token, lr.cfg.TokenInFlight,
			lr.signRounds.Load(), lr.signFailed.Load(), lr.signRefused.Load(),
			lr.uploadOK.Load(), lr.uploadRefused.Load(), st.Calls, last, lr.cfg.NodeRate,
			lr.rateOK.Load(), lr.rateRefused.Load(), lr.addressOK.Load(), lr.addressRefused.Load(), lr.unexpected.Load())
	}
}

// judge turns the ledger, the observer's peaks and the node's calls into
// the report.
func (lr *loadRun) judge(pk peaks, node *fakenode.Node, deadline time.Time) *Report {
	c := lr.cfg
	recs := lr.ledger
	rep := &Report{Config: c, Samples: pk.Samples, SampleInterval: pk.Interval, Nodes: pk.Nodes}

	console := func(r *record) bool { return r.kind == kindConsole }
	// A request the rate limit refused never reached the in-flight cap,
	// the heavy permits or the upload window (they are behind it).
	mayHoldHeavy := func(r *record) bool {
		return !r.refusedBy(slugRate) && !r.refusedBy(slugInFlight) && !r.refusedBy(slugHeavy) && !r.unauthenticated()
	}
	count := func(in func(*record) bool) (n int) {
		for i := range recs {
			if in(&recs[i]) {
				n++
			}
		}
		return n
	}
	row := func(name, configured string, limit, highest, requests int, ru *rule) Row {
		r := Row{Limit: name, Configured: configured, Cap: limit, Highest: highest, Requests: requests, FalseRefusals: -1}
		if ru != nil {
			r.Refused, r.FalseRefusals = judgeRefusals(recs, *ru)
		}
		return r
	}
	all := func(*record) string { return "" }

	// SQL console, per user.
	rep.Rows = append(rep.Rows, row("sql-console per user", strconv.Itoa(c.SQLConsoleCap), c.SQLConsoleCap, pk.User, count(console),
		&rule{in: console, scope: func(r *record) string { return r.user },
			refused: func(r *record) bool { return r.refusedBy(slugHeavy) && r.scope == "user" },
			holds:   mayHoldHeavy, cap: c.SQLConsoleCap, slack: c.Slack}))
	// Heavy, whole installation.
	rep.Rows = append(rep.Rows, row("heavy, installation", fmt.Sprintf("%d (pool %d / 4)", c.installationCap(), c.PoolMaxConns),
		c.installationCap(), pk.Installation, count(console),
		&rule{in: console, scope: all,
			refused: func(r *record) bool { return r.refusedBy(slugHeavy) && r.scope == "installation" },
			holds:   mayHoldHeavy, cap: c.installationCap(), slack: c.Slack}))
	// Sign-in failures per username and window.
	signIn := func(r *record) bool { return r.kind == kindSignIn }
	failed := func(r *record) bool { return signIn(r) && r.status == 401 }
	mode := "strict"
	if !c.SignInStrict {
		mode = "normal"
	}
	rep.Rows = append(rep.Rows, row("sign-in failures ("+mode+")", fmt.Sprintf("%d per %v", c.SignInFailures, c.SignInWindow),
		c.SignInFailures, countBy(recs, failed, func(r *record) string { return r.key }), count(signIn),
		&rule{in: signIn, scope: func(r *record) string { return r.key },
			refused: func(r *record) bool { return r.refusedBy(slugSignIn) },
			holds:   func(r *record) bool { return r.status == 401 || r.err != nil },
			cap:     c.SignInFailures, hold: c.SignInWindow, slack: c.Slack}))
	// Uploads per user and rolling window.
	upload := func(r *record) bool { return r.kind == kindUpload }
	rep.Rows = append(rep.Rows, row("uploads per user", fmt.Sprintf("%d per %v", c.UploadsPerHour, c.UploadWindow),
		c.UploadsPerHour, maxInWindow(recs, func(r *record) bool { return upload(r) && r.status == 201 }, func(r *record) string { return r.user }, c.UploadWindow),
		count(upload),
		&rule{in: upload, scope: func(r *record) string { return r.user },
			refused: func(r *record) bool { return r.refusedBy(slugUploads) },
			holds: func(r *record) bool {
				return !r.refusedBy(slugRate) && !r.refusedBy(slugUploads) && !r.refusedBy(slugInFlight) && !r.unauthenticated()
			},
			cap: c.UploadsPerHour, hold: c.UploadWindow, slack: c.Slack}))
	// Requests in flight per token.
	withToken := func(r *record) bool { return r.token != "" }
	rep.Rows = append(rep.Rows, row("in-flight per token", strconv.Itoa(c.TokenInFlight), c.TokenInFlight, pk.Token, count(withToken),
		&rule{in: withToken, scope: func(r *record) string { return r.token },
			refused: func(r *record) bool { return r.refusedBy(slugInFlight) },
			holds: func(r *record) bool {
				return !r.refusedBy(slugRate) && !r.refusedBy(slugInFlight) && !r.unauthenticated()
			},
			cap: c.TokenInFlight, slack: c.Slack}))
	if c.TokenInFlightKeep > 0 {
		r := &rep.Rows[len(rep.Rows)-1]
		r.Note = fmt.Sprintf("-token-in-flight-keep %v, every token moving to another replica on each request: %d refusals with room of %d (slots kept idle on another replica, not given back within the refused request's wait)",
			c.TokenInFlightKeep, r.FalseRefusals, r.Refused)
	}
	// Node rate: every call the node received, by the kernel's stamp.
	var at []time.Time
	unstamped := 0
	for _, call := range node.Calls() {
		at = append(at, call.At)
		if !call.Stamped {
			unstamped++
		}
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	most, series, _ := callsPerSecond(at, lr.t0, deadline)
	nodeRow := row("node rate (calls/s)", fmt.Sprintf("%d/s (%d/s per replica)", c.NodeRate, c.nodeShare()), c.NodeRate, most,
		count(func(r *record) bool { return r.kind == kindNode }), nil)
	nodeRow.Refused = count(func(r *record) bool { return r.kind == kindNode && r.status != 200 })
	nodeRow.Note = fmt.Sprintf("%d calls, by whole second from a second after the load began %v", len(at), series)
	if unstamped > 0 {
		nodeRow.Note += fmt.Sprintf("; %d calls without the kernel's stamp, stamped when the node handled them", unstamped)
	}
	// A replica whose share changed during the load (its ready count read
	// otherwise) is named: that explains an excess.
	for i := range recs {
		r := &recs[i]
		if r.kind == kindNode && r.status == 200 && (r.share != float64(c.nodeShare()) || r.ready != c.Replicas) {
			nodeRow.Note += fmt.Sprintf("; %s answered at %.1fs with share %v/s, %d ready replicas", r.token, r.end.Seconds(), r.share, r.ready)
			break
		}
	}

	// The node's verdict: the limiter's bound, every replica's bucket
	// (share × (1 + L) in any interval L) together, at the node.
	sent := c.nodeShare() * c.Replicas
	excess, n, from, length := nodeExcess(at, sent, float64(sent), c.NodeDelivery)
	nodeOver := excess > 0
	if n > 0 {
		nodeRow.Note += fmt.Sprintf("; closest to the bound: %d calls in %v from %.3fs, bound %d + %d/s × (%v + %v) = %.2f",
			n, length.Round(time.Millisecond), from.Sub(lr.t0).Seconds(), sent, sent, length.Round(time.Millisecond), c.NodeDelivery, float64(n)-excess)
		if nodeOver {
			nodeRow.Note += " (EXCEEDED)"
		}
	}
	if !nodeOver && most > c.NodeRate {
		nodeRow.Note += fmt.Sprintf("; %d in one second is within the buckets' bound (the replicas' bursts after a quiet moment, %d/s × (1 + 1 s))", most, sent)
	}
	rep.Rows = append(rep.Rows, nodeRow)

	// The rate per user, over every user of the load (the rate load's and
	// every other's: the rate applies to each, all its tokens together).
	rateRow := Row{Limit: "api rate per user", Configured: fmt.Sprintf("%d/s, burst %d", c.APIRate, c.APIBurst),
		Cap: c.APIBurst, Requests: count(withToken)}
	withIdentity := func(r *record) bool { return !r.unauthenticated() && !r.refusedBy(slugBanned) }
	rateOver, where := rateExcess(byUser(recs), float64(c.APIRate), withIdentity)
	rateRow.Highest = int(math.Ceil(rateOver))
	rateRow.Refused, rateRow.FalseRefusals = judgeRate(byUser(recs), float64(c.APIRate), c.APIBurst, c.Slack, withIdentity)
	rateRow.Note = fmt.Sprintf("highest = most requests one user had admitted in an interval, less %d/s × the interval (from the first one's send to the last one's answer)%s", c.APIRate, where)
	if c.APIBorrow {
		rateRow.Note = fmt.Sprintf("-api-borrow: %d refusals with room (units another replica held; reported, not judged); ", rateRow.FalseRefusals) + rateRow.Note
		rateRow.FalseRefusals = -1
	}
	rep.Rows = append(rep.Rows, rateRow)

	// The rate per client address of the requests without a token: the
	// address load's and the sign-in rounds'. Any answer but its refusal
	// passed it (401 unauthorized, or the sign-in's 401 and 429).
	anonymous := func(r *record) bool { return r.token == "" && r.addr != "" }
	addrRow := Row{Limit: "address rate per client", Configured: fmt.Sprintf("%d/s, burst %d", c.AddressRate, c.AddressBurst),
		Cap: c.AddressBurst, Requests: count(anonymous)}
	passedAddress := func(r *record) bool { return !r.refusedBy(slugBanned) }
	addrOver, addrWhere := rateExcess(byAddress(recs), float64(c.AddressRate), passedAddress)
	addrRow.Highest = int(math.Ceil(addrOver))
	addrRow.Refused, addrRow.FalseRefusals = judgeRate(byAddress(recs), float64(c.AddressRate), c.AddressBurst, c.Slack, passedAddress)
	addrRow.Note = fmt.Sprintf("highest = most requests one client address had admitted in an interval, less %d/s × the interval%s", c.AddressRate, strings.Replace(addrWhere, "highest for ", "highest for address ", 1))
	rep.Rows = append(rep.Rows, addrRow)

	for i := range rep.Rows {
		r := &rep.Rows[i]
		over := r.Highest > r.Cap
		if i == 5 {
			over = nodeOver
		}
		switch {
		case over && i == 2 && !c.SignInStrict:
			r.Verdict = VerdictDocumented
			r.Note = fmt.Sprintf("normal mode: %d passwords evaluated; attempts in flight when the limit is reached are evaluated (documented; run with -sign-in-strict to judge)", r.Highest)
		case i == 5 && !over && sent > c.NodeRate && most > c.NodeRate:
			r.Verdict = VerdictDocumented
			r.Note = fmt.Sprintf("over by rounding: each replica takes ceil(%d/%d) = %d/s (ADR-0196 decision 6); ", c.NodeRate, c.Replicas, c.nodeShare()) + r.Note
		case over:
			r.Verdict = VerdictExceeded
		case r.Highest < r.Cap && r.Refused == 0,
			(i == 6 || i == 7) && r.Refused == 0: // the rates' highest is measured generously: reached means refused
			r.Verdict = VerdictNotReached
		default:
			r.Verdict = VerdictOK
		}
	}

	rep.Unexpected = map[string]int{}
	for i := range recs {
		r := &recs[i]
		if r.refusedBy(slugBanned) && r.err == nil {
			// A ban is decided before any rate and sends no RateLimit
			// headers; without bans it is unexpected.
			if c.BanAfter == 0 {
				rep.Unexpected[fmt.Sprintf("%s %d %s without -ban-after", kindName(r.kind), r.status, r.slug)]++
			}
			continue
		}
		if r.expected() && r.token == "" && r.addr != "" && r.err == nil && !r.addressHeaders {
			// Every answer to a request without a token passed the
			// address rate or was refused by it.
			rep.Unexpected[fmt.Sprintf("%s %d %s without RateLimit-Policy and RateLimit of the policy address", kindName(r.kind), r.status, r.slug)]++
		}
		if r.expected() && r.token != "" && r.err == nil && !r.rateHeaders {
			// Every /api/ answer but the sign-in's passed the rate limit
			// or was refused by it: either way it carries its headers.
			rep.Unexpected[fmt.Sprintf("%s %d %s without RateLimit-Policy and RateLimit of the policy api", kindName(r.kind), r.status, r.slug)]++
		}
		if r.expected() {
			continue
		}
		what := fmt.Sprintf("%s %d %s", kindName(r.kind), r.status, r.slug)
		if r.err != nil {
			what = fmt.Sprintf("%s error %v", kindName(r.kind), r.err)
		}
		rep.Unexpected[what]++
	}
	return rep
}

// judgeBanRow adds the bans' row to rep: the banned answers, those the
// observer and the ledger cannot justify (false), and the requests that
// passed a ban in force (highest; the cap is 0).
func (lr *loadRun) judgeBanRow(rep *Report, o *banObserver) {
	c := lr.cfg
	bans, polls := o.bans()
	j := judgeBans(lr.ledger, bans, c.BanAfter, c.BanWithin, c.BanFor, c.Slack)
	r := Row{Limit: "bans", Configured: fmt.Sprintf("%d refusals within %v: %v", c.BanAfter, c.BanWithin, c.BanFor),
		Cap: 0, Highest: j.passed, Requests: j.banned, Refused: j.banned, FalseRefusals: j.falseBans}
	r.Note = fmt.Sprintf("highest = requests that passed a ban in force (sent %v after it began, answered %v before it ended), of %d sent and answered so; %d keys banned %d times by the observer's %d polls of pglimit.ban",
		banPropagation, banMargin, j.inForce, j.keys, j.spans, polls)
	if j.where != "" {
		r.Note += "; " + j.where
	}
	switch {
	case j.passed > 0:
		r.Verdict = VerdictExceeded
	case j.banned == 0 || j.inForce == 0:
		r.Verdict = VerdictNotReached
	default:
		r.Verdict = VerdictOK
	}
	rep.Rows = append(rep.Rows, r)
}

func kindName(k kind) string {
	return [...]string{"console", "sign-in", "upload", "node", "rate", "address"}[k]
}
