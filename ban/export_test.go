package ban

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
