//go:build unix

package nodelimit_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/pglimit/pglimit/nodelimit"
)

// starvedEnv makes the test binary the starved replica of
// TestStarvedReplicaKeepsToItsShare (see starvedReplica).
const starvedEnv = "NODELIMIT_STARVED_REPLICA"

func init() {
	if os.Getenv(starvedEnv) != "" {
		starvedChild = starvedReplica
	}
}

// starvedReplica is the child process of
// TestStarvedReplicaKeepsToItsShare: a replica alone with a node rate of
// 2, whose four callers take turns as fast as they are let. It says
// "ready" once they call, and when a line comes on stdin it stops and
// prints the time of every turn (read by each caller as Wait returned, in
// Unix nanoseconds), one a line.
func starvedReplica() {
	l, err := nodelimit.New(nodelimit.Options{Rate: 2, Logger: quiet})
	if err != nil {
		panic(err)
	}
	n, err := l.Node("n")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var (
		mu    sync.Mutex
		turns []time.Time
		wg    sync.WaitGroup
	)
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if n.Wait(ctx) == nil {
					at := time.Now()
					mu.Lock()
					turns = append(turns, at)
					mu.Unlock()
				}
			}
		})
	}
	fmt.Println("ready")
	_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
	cancel()
	wg.Wait()
	for _, at := range turns {
		fmt.Println(at.UnixNano())
	}
	os.Exit(0)
}

// TestStarvedReplicaKeepsToItsShare: a replica whose process is stopped
// (SIGSTOP, as a machine too loaded to run it) for two seconds while its
// calls wait lets, when it runs again, no more than its bucket allows: in
// any interval of length L, at most burst + share × L turns (2 + 2 × L
// here), judged on the times its callers saw Wait return. The replica
// is a child process (this test binary): its callers keep four calls
// waiting at every moment, so its bucket is pressed to the bound.
func TestStarvedReplicaKeepsToItsShare(t *testing.T) {
	t.Parallel()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), starvedEnv+"=1")
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	out := bufio.NewScanner(stdout)
	if !out.Scan() || out.Text() != "ready" {
		t.Fatalf("the replica did not start: %q %v", out.Text(), out.Err())
	}
	time.Sleep(time.Second)
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	stopped := time.Now()
	time.Sleep(2 * time.Second)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	resumed := time.Now()
	time.Sleep(1500 * time.Millisecond)
	if _, err := fmt.Fprintln(stdin, "end"); err != nil {
		t.Fatal(err)
	}
	var turns []time.Time
	for out.Scan() {
		ns, err := strconv.ParseInt(out.Text(), 10, 64)
		if err != nil {
			t.Fatalf("the replica printed %q", out.Text())
		}
		turns = append(turns, time.Unix(0, ns))
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the replica: %v", err)
	}
	slices.SortFunc(turns, func(a, b time.Time) int { return a.Compare(b) })

	const burst, share = 2, 2.0
	worst, count, from, length := intervalExcess(turns, burst, share)
	gap := time.Duration(0)
	for i := 1; i < len(turns); i++ {
		gap = max(gap, turns[i].Sub(turns[i-1]))
	}
	t.Logf("%d turns; stopped %v; longest gap between turns %v; most over burst + share × L: %.3f (%d turns in %v from %v after the stop ended)",
		len(turns), resumed.Sub(stopped).Round(time.Millisecond), gap.Round(time.Millisecond), worst, count, length.Round(time.Millisecond), from.Sub(resumed).Round(time.Millisecond))
	defer func() {
		if t.Failed() {
			for _, at := range turns {
				t.Logf("a turn %v after the replica ran again", at.Sub(resumed).Round(time.Microsecond))
			}
		}
	}()
	if gap < 1500*time.Millisecond {
		t.Fatalf("no gap of the stop among the turns (longest %v): the replica was not starved while its calls waited", gap)
	}
	if worst > 0 {
		t.Errorf("%d turns in %v: more than burst + share × L = %.2f", count, length.Round(time.Millisecond), burst+share*length.Seconds())
	}
	if worst < -1 {
		t.Errorf("never within a call of the bound (%.3f): the callers did not press the bucket", worst)
	}
}

// intervalExcess returns the most that the times in any interval between
// two of them (both included) exceed burst + rate × its length, with the
// interval: how many, from when, how long. at is sorted.
func intervalExcess(at []time.Time, burst int, rate float64) (worst float64, count int, from time.Time, length time.Duration) {
	worst = -float64(burst) - 1
	for i := range at {
		for j := i; j < len(at); j++ {
			l := at[j].Sub(at[i])
			if e := float64(j-i+1) - float64(burst) - rate*l.Seconds(); e > worst {
				worst, count, from, length = e, j-i+1, at[i], l
			}
		}
	}
	return worst, count, from, length
}
