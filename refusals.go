package pglimit

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/observe"
)

// RefusalMinutes are the refusals of an installation's limits per minute,
// counted by every replica (the operator's view of how often each limit
// refuses, whichever replica refused).
type RefusalMinutes struct {
	// Minutes are the minutes counted, oldest first, on the database
	// clock; the last is the current minute.
	Minutes []time.Time
	// Limits are the limits that refused in those minutes, by name.
	Limits []LimitRefusals
}

// LimitRefusals are one limit's refusals per minute.
type LimitRefusals struct {
	// Name is the limit's name (its Options.Name).
	Name string
	// Refused is the requests the limit refused, one count per minute of
	// RefusalMinutes.Minutes.
	Refused []int64
	// DryRunRefused is the requests the limit would have refused and let
	// through in dry run, one count per minute.
	DryRunRefused []int64
}

// Refusals returns the refusals of every limit of pool's database in the
// last minutes minutes (1..60), the current minute included. Every limiter
// (heavy, inflight, upload, signin, ratelimit) adds its refusals to the
// UNLOGGED table pglimit.refusal_minute: in memory at once, and in the
// table in one statement about once a second while it refuses, so a
// refusal shows here within a second or two; a granted request writes
// nothing there. Rows lapse an hour after their minute.
func Refusals(ctx context.Context, pool db.DBTX, minutes int) (*RefusalMinutes, error) {
	m, err := observe.Recent(ctx, pool, minutes)
	if err != nil {
		return nil, fmt.Errorf("pglimit: refusals: %w", err)
	}
	out := &RefusalMinutes{Minutes: m.Minutes, Limits: make([]LimitRefusals, len(m.Limits))}
	for i, l := range m.Limits {
		out.Limits[i] = LimitRefusals(l)
	}
	return out, nil
}
