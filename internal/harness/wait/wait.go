// Package wait is the tests' one wait for a condition that another
// goroutine, replica or process brings about.
package wait

import (
	"testing"
	"time"
)

// For polls cond until it holds and returns how long that took, failing t
// (saying what) when within passes first. It polls every millisecond at
// first and backs off to every 50 ms, so a short wait is measured closely
// (a bus's delivery) and a long one costs little (a condition that asks a
// server).
func For(t testing.TB, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	pause := time.Millisecond
	for !cond() {
		if waited := time.Since(start); waited > within {
			t.Fatalf("%s: not within %v (waited %v)", what, within, waited.Round(time.Millisecond))
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
	return time.Since(start)
}
