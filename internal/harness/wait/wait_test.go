package wait

import (
	"sync/atomic"
	"testing"
	"time"
)

// fakeT records a failure instead of ending the goroutine.
type fakeT struct {
	testing.TB
	failed atomic.Bool
	msg    string
}

func (f *fakeT) Helper() {}
func (f *fakeT) Fatalf(format string, args ...any) {
	f.failed.Store(true)
	f.msg = format
	panic(f) // stands in for runtime.Goexit
}

// TestFor: a condition that comes true is waited for and the wait
// returned; one that never does fails the test after within.
func TestFor(t *testing.T) {
	var n atomic.Int32
	if d := For(t, time.Minute, "the third poll", func() bool { return n.Add(1) >= 3 }); d <= 0 || d > 30*time.Second {
		t.Errorf("waited %v for the third poll", d)
	}
	f := &fakeT{TB: t}
	start := time.Now()
	func() {
		defer func() {
			if r := recover(); r != f {
				panic(r)
			}
		}()
		For(f, 50*time.Millisecond, "never", func() bool { return false })
	}()
	if !f.failed.Load() {
		t.Fatal("a condition that never held did not fail the test")
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("failed after %v, before within (50ms)", waited)
	}
}
