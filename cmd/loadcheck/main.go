// Command loadcheck drives concurrent load against every limit of the
// reference service running as several replicas, and judges each limit
// with an observer independent of pglimit's own tables.
//
//	go run ./cmd/loadcheck                 # 3 replicas, 30 s of load, embedded PostgreSQL
//	go run ./cmd/loadcheck -duration 5s -replicas 2
//	DATABASE_URL=postgres://... go run ./cmd/loadcheck
//	go run ./cmd/loadcheck -citus          # on a Citus coordinator and two workers
//
// It uses DATABASE_URL (or -database-url), else starts an embedded
// throwaway PostgreSQL (internal/harness/embedpg), or with -citus a throwaway Citus
// cluster (internal/harness/citustest) whose coordinator the replicas share; builds cmd/studio and starts
// -replicas of it as child processes on free loopback ports
// (internal/harness/replicaset) with -demo and the limits below; serves a fake
// broker node in-process (cmd/internal/fakenode); waits until every replica
// has taken its share of the node rate; then for -duration runs, at once:
//
//   - SQL console load: for each of alice, bob and carol, -workers-per-token
//     loops on each of -tokens-per-user tokens, each posting
//     SELECT pg_sleep(0.2), 'lc-<run>:<user>:<token>' to the replicas in turn;
//   - sign-in rounds: 2×limit+2 concurrent wrong passwords for a fresh
//     username, spread over the replicas, round after round;
//   - uploads: -token-in-flight loops per user, on a token of their own;
//   - queue listings of the fake node: -node-workers loops per replica, on
//     tokens of -token-in-flight loops each (enough that every replica has a
//     call waiting at its share of the node rate while the others do their
//     database work);
//   - the API rate: -rate-workers loops on a token of their own, reading
//     GET /api/limits from the replicas in turn, above -api-rate.
//
// A loop that is refused waits -pause and tries again. Nothing is sent after
// the deadline; requests already sent are answered.
//
// # Observers and verdicts
//
//   - sql-console per user, heavy installation cap, in-flight per token:
//     pg_stat_activity, polled continuously, counting active statements by
//     the marker in their SQL text (on a Citus coordinator, on every node
//     of pg_dist_node, summed). A console statement is active only while
//     its request holds its heavy permit and its in-flight slot, so a count
//     above a limit is an over-grant, never a sampling artefact (the count
//     can only be lower than the slots held).
//
//   - sign-in failures: the answers. Highest = most 401 answers for one
//     username in its window. Judged in -sign-in-strict mode (the default
//     here): no more than the limit may be evaluated. In normal mode the
//     documented weakness lets attempts already in flight through; the row
//     then says "documented: N evaluated" and does not fail the check.
//
//   - uploads: the answers. Highest = most 201 answers for one user whose
//     requests, from send to answer, all fit in less than -upload-window:
//     their claims were then less than a window apart, so more than the
//     limit of them is an over-grant whatever the timing.
//
//   - node rate: the fake node's own record of the calls it received, each
//     stamped with the time the kernel received its first byte
//     (SO_TIMESTAMPNS on the node's connections), so a load check starved
//     of CPU, which handles the calls late and at once, does not bunch
//     them. Highest = most calls in one whole second, from a second after
//     the load began. The verdict is the node limiter's own bound: each
//     replica lets at most share × (1 + L) calls go in any interval of
//     length L, so the node may receive burst + rate × L with burst = rate
//     = replicas × share, the interval lengthened by -node-delivery, the
//     most a call takes from its turn to the node (the replica's own
//     sending of it): EXCEEDED when any interval holds more. When the rate
//     is not a multiple of the replicas, each takes ceil(rate/replicas) and
//     the node may see up to that times the replicas (ADR-0196 decision 6):
//     reported as "documented", not failed.
//
//   - api rate per user: the answers. Highest = most requests of one user
//     the rate limit admitted in an interval, less -api-rate × the interval
//     measured from the first one's send to the last one's answer (the
//     decisions fell within it, so latency only lowers it): more than
//     -api-burst is an over-grant. Every /api/ answer but the sign-in's must
//     carry RateLimit-Policy and RateLimit of the policy api.
//
// False refusal: a 429 of a limit although, by the client's ledger of every
// request it sent, fewer than the limit's value of other requests of the
// same scope can have held a slot at any moment between the refused
// request's send and its answer. A request is a possible holder from its
// send until its answer plus -slack (a slot may be released just after the
// answer is read), plus the window for an upload or a failed sign-in,
// unless it was refused before it could claim. The observer of a slot held
// is the ledger, not pg_stat_activity: a statement shows there only for
// part of the time its permit is held, so judging refusals by it would call
// correct refusals false. Only the load check drives the service, so the
// rule can miss a false refusal but never invents one.
//
// It prints live progress every -progress, then a table — limit, configured
// value, highest value observed, requests, refused, false refusals, verdict
// — and exits 1 when a limit was exceeded or an answer was unexpected (a
// 5xx, a transport error), 2 when the check could not run. The replicas'
// and the database's logs are kept, and their directory printed, unless the
// check passed.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	code, err := run(os.Args[1:])
	if err != nil && !errors.Is(err, flag.ErrHelp) {
		fmt.Fprintln(os.Stderr, "loadcheck:", err)
	}
	os.Exit(code)
}

func run(args []string) (int, error) {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("loadcheck", flag.ContinueOnError)
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "primary the replicas share (default $DATABASE_URL, else an embedded throwaway PostgreSQL); it is migrated and seeded with demo data")
	fs.BoolVar(&cfg.Citus, "citus", false, "without a database URL, start a throwaway Citus cluster (a coordinator and two workers) instead of one server")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas of cmd/studio")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of the load, after the warm-up (1s to 10m)")
	fs.StringVar(&cfg.Studio, "studio", "", "a built cmd/studio binary (default: build one)")
	fs.StringVar(&cfg.LogDir, "log-dir", "", "directory for the replicas' and the database's logs (default: a temporary one, removed when the check passes)")
	fs.BoolVar(&cfg.KeepLogs, "keep-logs", false, "keep the logs even when the check passes")
	fs.DurationVar(&cfg.ProgressEvery, "progress", cfg.ProgressEvery, "interval of the live progress lines (0: none)")
	fs.IntVar(&cfg.SQLConsoleCap, "sql-console-cap", cfg.SQLConsoleCap, "SQL console queries per user at once (cmd/studio flag)")
	fs.IntVar(&cfg.PoolMaxConns, "pool-max-conns", cfg.PoolMaxConns, "replica pool size; installation heavy cap = max(1, this / 4) (cmd/studio flag)")
	fs.IntVar(&cfg.SignInFailures, "sign-in-failures", cfg.SignInFailures, "failed sign-ins per username per window (cmd/studio flag)")
	fs.DurationVar(&cfg.SignInWindow, "sign-in-window", cfg.SignInWindow, "sign-in throttle window, at least 10s (cmd/studio flag)")
	fs.BoolVar(&cfg.SignInStrict, "sign-in-strict", cfg.SignInStrict, "strict sign-in mode (cmd/studio flag); in normal mode the sign-in row is reported, not judged")
	fs.IntVar(&cfg.UploadsPerHour, "uploads-per-hour", cfg.UploadsPerHour, "uploads per user per window (cmd/studio flag)")
	fs.DurationVar(&cfg.UploadWindow, "upload-window", cfg.UploadWindow, "the uploads' rolling window (cmd/studio flag)")
	fs.IntVar(&cfg.TokenInFlight, "token-in-flight", cfg.TokenInFlight, "requests in flight per token (cmd/studio flag)")
	fs.DurationVar(&cfg.TokenInFlightKeep, "token-in-flight-keep", 0, "replicas keep a token's in-flight slot this long after its request (cmd/studio flag); the cap is judged as without it, its refusals with room are counted")
	fs.IntVar(&cfg.NodeRate, "node-rate", cfg.NodeRate, "calls per second to the node for the installation (cmd/studio flag)")
	fs.IntVar(&cfg.APIRate, "api-rate", cfg.APIRate, "requests per second per user, all its API tokens together (cmd/studio flag -api-rate N/s)")
	fs.IntVar(&cfg.APIBurst, "api-burst", cfg.APIBurst, "requests at once above -api-rate (cmd/studio flag)")
	fs.BoolVar(&cfg.APIBorrow, "api-borrow", cfg.APIBorrow, "the rate limit borrows units for hot tokens (cmd/studio flag); its refusals with room are reported, not judged")
	fs.IntVar(&cfg.RateWorkers, "rate-workers", cfg.RateWorkers, "loops driving one token above its rate")
	fs.IntVar(&cfg.AddressRate, "address-rate", cfg.AddressRate, "requests per second per client address without a token (cmd/studio flag -address-rate N/s)")
	fs.IntVar(&cfg.AddressBurst, "address-burst", cfg.AddressBurst, "requests at once above -address-rate (cmd/studio flag); at least 2 × -sign-in-failures + 2")
	fs.IntVar(&cfg.AddressWorkers, "address-workers", cfg.AddressWorkers, "loops sending requests without a token from -addresses client addresses through the trusted stand-in proxy 127.0.0.2")
	fs.IntVar(&cfg.Addresses, "addresses", cfg.Addresses, "client addresses of the address load")
	fs.IntVar(&cfg.BanAfter, "ban-after", cfg.BanAfter, "rate refusals of a user or client address within -ban-within that ban it for -ban-for (cmd/studio flags); 0: no bans. The bans row judges them by an observer of pglimit.ban")
	fs.DurationVar(&cfg.BanWithin, "ban-within", 5*time.Second, "the window -ban-after refusals are counted in (cmd/studio flag)")
	fs.DurationVar(&cfg.BanFor, "ban-for", 2*time.Second, "how long a ban lasts (cmd/studio flag)")
	fs.IntVar(&cfg.NodeWorkers, "node-workers", cfg.NodeWorkers, "loops per replica listing the node's queues, on tokens of -token-in-flight loops each")
	fs.IntVar(&cfg.Queues, "queues", cfg.Queues, "queues of the fake node")
	fs.DurationVar(&cfg.ConsoleSleep, "console-sleep", cfg.ConsoleSleep, "pg_sleep of each console statement")
	fs.IntVar(&cfg.TokensPerUser, "tokens-per-user", cfg.TokensPerUser, "console tokens per user")
	fs.IntVar(&cfg.WorkersPerToken, "workers-per-token", cfg.WorkersPerToken, "console loops per token")
	fs.DurationVar(&cfg.Pause, "pause", cfg.Pause, "wait after a refusal")
	fs.DurationVar(&cfg.Slack, "slack", cfg.Slack, "added to every request's end when false refusals are judged")
	fs.DurationVar(&cfg.NodeDelivery, "node-delivery", cfg.NodeDelivery, "the most a call takes from its node turn to the node; the node rate is judged as burst + rate × (L + this) in any interval L")
	fs.DurationVar(&cfg.WarmupTimeout, "warmup-timeout", cfg.WarmupTimeout, "bound of the wait for every replica's node share")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, err
		}
		return 2, err
	}
	if fs.NArg() > 0 {
		return 2, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	cfg.Progress = os.Stderr
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg)
	if err != nil {
		return 2, err
	}
	rep.Print(os.Stdout)
	if rep.Failed() {
		return 1, nil
	}
	return 0, nil
}
