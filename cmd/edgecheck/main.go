// Command edgecheck reruns issue 42's slow-connection attack against the
// reference service and judges what another user sees while it runs.
//
//	go run ./cmd/edgecheck                       # 20,000 slow connections, 2 replicas, embedded PostgreSQL
//	go run ./cmd/edgecheck -conns 300 -baseline 5s -attack 20s -body-timeout 3s   # the short run
//	DATABASE_URL=postgres://... go run ./cmd/edgecheck
//
// It uses DATABASE_URL (or -database-url), else starts an embedded
// throwaway PostgreSQL; builds cmd/studio and starts -replicas of it with
// -demo, -max-conns-per-peer and -body-timeout. Then, against the first
// replica:
//
//  1. the baseline: a user (bob's token, from 127.0.0.4) reads
//     GET /api/events?size=1 at -user-rate requests a second for -baseline,
//     and every answer's latency is kept;
//  2. the attack: from 127.0.0.3, -conns connections, opened -dialers at a
//     time, each sending the headers of a POST /limits or POST /audit with
//     Content-Length: 4000 and then a byte every 8 s, as the attacker of
//     issue 42 did, while the user goes on reading for -attack. A
//     connection the server closes is recorded (when, and whether at once);
//     one still open when the attack ends is counted as held to the end.
//
// The replica's resident memory (VmRSS of /proc/PID/status) is sampled
// every 200 ms throughout. It prints both phases' p50 and p99 side by side,
// the user's requests left unanswered (an error or no answer within 10 s),
// the attacker's connections held and closed, the longest a held one was
// open, and the replica's peak memory; and exits 1 when the attack phase
// fails a bound: p50 within -max-p50-ratio (3) of the baseline's, p99
// under -max-p99 (1 s), nothing unanswered, every held connection closed
// within -max-held (65 s), peak memory under -max-rss-mb (200).
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
	cfg := defaultConfig()
	fs := flag.NewFlagSet("edgecheck", flag.ExitOnError)
	fs.StringVar(&cfg.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "PostgreSQL the replicas share (default $DATABASE_URL, else an embedded throwaway one)")
	fs.IntVar(&cfg.Replicas, "replicas", cfg.Replicas, "replicas of cmd/studio (the attack and the user go to the first)")
	fs.IntVar(&cfg.Conns, "conns", cfg.Conns, "slow connections the attacker opens from one address")
	fs.IntVar(&cfg.Dialers, "dialers", cfg.Dialers, "connections the attacker opens at once")
	fs.DurationVar(&cfg.Baseline, "baseline", cfg.Baseline, "how long the user reads before the attack")
	fs.DurationVar(&cfg.Attack, "attack", cfg.Attack, "how long the attack runs while the user reads")
	fs.Float64Var(&cfg.UserRate, "user-rate", cfg.UserRate, "the user's requests a second")
	fs.DurationVar(&cfg.BodyTimeout, "body-timeout", cfg.BodyTimeout, "the replicas' -body-timeout")
	fs.IntVar(&cfg.MaxConnsPerPeer, "max-conns-per-peer", cfg.MaxConnsPerPeer, "the replicas' -max-conns-per-peer")
	fs.Float64Var(&cfg.MaxP50Ratio, "max-p50-ratio", cfg.MaxP50Ratio, "the attack's p50 may be at most this times the baseline's")
	fs.DurationVar(&cfg.MaxP99, "max-p99", cfg.MaxP99, "the attack's p99 must be under this")
	fs.DurationVar(&cfg.MaxHeld, "max-held", cfg.MaxHeld, "every connection the replica held must be closed within this of its opening")
	fs.Float64Var(&cfg.MaxRSSMB, "max-rss-mb", cfg.MaxRSSMB, "the replica's peak resident memory must be under this many MB")
	_ = fs.Parse(os.Args[1:])

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := Run(ctx, cfg, os.Stderr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "edgecheck:", err)
		os.Exit(2)
	}
	fmt.Print(rep.String())
	if fails := rep.Failures(cfg); len(fails) > 0 {
		for _, f := range fails {
			fmt.Println("FAIL:", f)
		}
		os.Exit(1)
	}
	fmt.Println("PASS")
}

// errUsage is a configuration the run cannot do.
var errUsage = errors.New("edgecheck: bad configuration")

func (c Config) check() error {
	if c.Replicas < 1 || c.Conns < 1 || c.Dialers < 1 || c.UserRate <= 0 || c.Baseline <= 0 || c.Attack <= 0 ||
		c.BodyTimeout <= 0 || c.MaxConnsPerPeer < 1 {
		return fmt.Errorf("%w: %+v", errUsage, c)
	}
	if c.Attack < c.BodyTimeout+10*time.Second {
		return fmt.Errorf("%w: -attack %v must outlast -body-timeout %v by 10s, so held connections can be seen closed", errUsage, c.Attack, c.BodyTimeout)
	}
	return nil
}
