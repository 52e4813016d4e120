package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/observe"
)

// RefusalMinutes are the refusals of an installation's limits per minute,
// counted by every replica: the operator's view of how often each limit
// refuses, whichever replica refused.
type RefusalMinutes struct {
	// Minutes are the minutes counted, oldest first, on the database
	// clock; the last is the current minute.
	Minutes []time.Time
	// Refused holds, by limit name (its Options.Name), the requests the
	// limit refused, one count per minute of Minutes. A limit that refused
	// nothing in those minutes, in dry run or not, is absent.
	Refused map[string][]int64
	// DryRunRefused holds, by limit name, the requests the limit would
	// have refused and let through in dry run, one count per minute. It
	// has the same limits as Refused.
	DryRunRefused map[string][]int64
}

// Refusals returns the refusals of every limit of pool's database in the
// last minutes minutes (1..60), the current minute included. Every limiter
// (heavy, inflight, upload, signin, ratelimit) adds its refusals to the
// UNLOGGED table pglimit.refusal_minute: in memory at once, and in the
// table in one statement about once a second while it refuses, so a
// refusal shows here within a second or two; a granted request writes
// nothing there. Rows lapse an hour after their minute, and a crash of the
// database empties the table.
func Refusals(ctx context.Context, pool *pgxpool.Pool, minutes int) (*RefusalMinutes, error) {
	m, err := observe.Recent(ctx, pool, minutes)
	if err != nil {
		return nil, fmt.Errorf("pglimit: refusals: %w", err)
	}
	out := &RefusalMinutes{Minutes: m.Minutes, Refused: make(map[string][]int64, len(m.Limits)),
		DryRunRefused: make(map[string][]int64, len(m.Limits))}
	for _, l := range m.Limits {
		out.Refused[l.Name] = l.Refused
		out.DryRunRefused[l.Name] = l.DryRunRefused
	}
	return out, nil
}
