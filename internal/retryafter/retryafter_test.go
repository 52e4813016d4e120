package retryafter

import (
	"testing"
	"time"
)

// TestSeconds rounds up and never says 0.
func TestSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int{0: 1, -time.Second: 1, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, time.Minute: 60} {
		if got := Seconds(d); got != want {
			t.Errorf("Seconds(%v) = %d, want %d", d, got, want)
		}
	}
}
