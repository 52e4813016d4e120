package scratch

import (
	"os/exec"
	"testing"
	"time"
)

// TestAwaitExit: a process that outlives the grace is killed, and
// AwaitExit returns once it has exited.
func TestAwaitExit(t *testing.T) {
	cmd := exec.Command("sleep", "600")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	AwaitExit(cmd.Process, done, 10*time.Millisecond)
	select {
	case <-done:
	default:
		t.Fatal("AwaitExit returned before the process exited")
	}
	if cmd.ProcessState.Success() {
		t.Fatal("sleep 600 exited successfully: it was not killed")
	}
}
