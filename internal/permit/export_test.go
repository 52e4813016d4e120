package permit

// OnShard makes l claim with the function a Citus cluster runs on a
// scope's shard (SlotClaimOnShard) on one server, so tests hold it to the
// same guarantees.
func OnShard(l *Leaser) { l.citus.Set(true) }

// Queued is how many claims and releases of l wait for a round trip.
func Queued(l *Leaser) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.queue)
}
