package tick

import (
	"context"
	"testing"
	"time"
)

// TestEvery: the first call comes at once, later ones every interval, and
// Every returns once ctx ends, after the call under way, calling no more.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := make(chan struct{}, 100)
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func(context.Context) { calls <- struct{}{} })
	}()
	for range 3 {
		select {
		case <-calls:
		case <-time.After(time.Minute):
			t.Fatal("Every called do fewer than 3 times in a minute at an interval of 1 ms")
		}
	}
	cancel()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Every did not return after ctx ended")
	}
	n := len(calls)
	time.Sleep(5 * time.Millisecond)
	if len(calls) != n {
		t.Fatal("do was called after Every returned")
	}
}

// TestEveryFirstCallAtOnce: with an interval of an hour, the first call
// still comes at once, and an ended ctx ends Every after it.
func TestEveryFirstCallAtOnce(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	n := 0
	Every(ctx, time.Hour, func(context.Context) { n++; cancel() })
	if n != 1 {
		t.Fatalf("%d calls, want 1", n)
	}
}
