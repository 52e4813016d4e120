package main

import (
	"context"
	"io"
	"testing"
	"time"

	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

func TestMain(m *testing.M) { pgtest.Main(m, replicaset.Cleanup) }

// TestEdgeCheckShort is the short run of the slow-connection attack: 300
// connections from one address against a replica at -max-conns-per-peer
// 16 and -body-timeout 3s, while another user reads. The replica holds
// exactly 16 and closes the other 284 as soon as it accepts them, closes
// the 16 once their bodies' time is up (judged within the body timeout and
// 10 s), answers every request of the other user (who keeps at most two
// waiting, half its history cap, as a client that does not pile up
// requests on a slow machine), and stays under 200 MB.
// The latencies of both phases are logged, not judged: a loaded CI
// machine decides them more than the attack does (make edgecheck judges
// them, on the full run).
func TestEdgeCheckShort(t *testing.T) {
	cfg := defaultConfig()
	cfg.DatabaseURL = pgtest.URL(t, pgtest.Migration{FS: studioschema.FS(), Table: studioschema.VersionTable, LockID: studioschema.LockID})
	cfg.Conns, cfg.Dialers, cfg.MaxConnsPerPeer = 300, 20, 16
	cfg.Baseline, cfg.Attack, cfg.BodyTimeout = 3*time.Second, 15*time.Second, 3*time.Second
	rep, err := Run(context.Background(), cfg, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + rep.String())
	if rep.Opened != cfg.Conns || rep.DialFailed != 0 {
		t.Errorf("%d of %d connections opened, %d could not connect", rep.Opened, cfg.Conns, rep.DialFailed)
	}
	if rep.Held != cfg.MaxConnsPerPeer || rep.ClosedAtOnce != cfg.Conns-cfg.MaxConnsPerPeer {
		t.Errorf("%d held and %d closed at once; want %d and %d", rep.Held, rep.ClosedAtOnce, cfg.MaxConnsPerPeer, cfg.Conns-cfg.MaxConnsPerPeer)
	}
	if rep.HeldToEnd != 0 || rep.LongestHeld > cfg.BodyTimeout+10*time.Second {
		t.Errorf("held connections: %d open at the end, the longest %v; want each closed within %v", rep.HeldToEnd, rep.LongestHeld, cfg.BodyTimeout+10*time.Second)
	}
	if rep.Unanswered != 0 || rep.BaseN == 0 || rep.AttackN == 0 {
		t.Errorf("the other user: %d unanswered %v, %d and %d answered", rep.Unanswered, rep.Unanswers, rep.BaseN, rep.AttackN)
	}
	if rep.PeakRSSMB >= cfg.MaxRSSMB {
		t.Errorf("the replica's memory peaked at %.1f MB", rep.PeakRSSMB)
	}
}
