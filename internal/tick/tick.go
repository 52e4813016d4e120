// Package tick runs the periodic work of pglimit's background loops
// (housekeeping, the replica registry, the read replica's probe, the
// node limit's share), written once.
package tick

import (
	"context"
	"time"
)

// Every calls do at once and then every interval, until ctx ends; it
// returns after the call under way. A call that takes longer than interval
// delays the next (ticks do not pile up).
func Every(ctx context.Context, interval time.Duration, do func(context.Context)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		do(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
