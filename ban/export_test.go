package ban

import "time"

// Settled reports whether b has read the live bans in its bus's current
// epoch and is not reading them now.
func Settled(b *Bans) bool {
	return b.bus.Live() && b.loaded.Load() == b.bus.Epoch()+1 && !b.loading.Load()
}

// Remembered is the number of bans b keeps in memory.
func Remembered(b *Bans) int {
	b.mu.RLock()
	defer b.mu.RUnlock()
	return len(b.mem)
}

// ClockError is how far b's estimate of the database clock may be off:
// half the round trip of the statement it was taken from.
func ClockError(b *Bans) time.Duration {
	b.clockMu.Lock()
	defer b.clockMu.Unlock()
	return b.clockRTT / 2
}
