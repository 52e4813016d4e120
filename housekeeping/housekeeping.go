// Package housekeeping deletes the lapsed rows of pglimit's limit tables:
// permits, in-flight and upload slots, sign-in throttles and request-rate
// windows that nobody came back to, replicas that stopped heartbeating,
// refusals per minute older than an hour, calendar quota periods that
// ended, bans whose window and ban ended, and allow and deny rules
// (package access) past their expiry.
//
// What it guarantees: every replica sweeps in the background while
// pglimit.Run runs (every minute by default, RunOptions.Housekeeping), and
// at most one replica deletes at any moment. A lapsed row already counts
// for nothing — every claim and read ignores it — so housekeeping changes
// no decision: it only keeps the tables and their indexes small. Sweep
// runs one sweep now, for a job runner or a test.
//
// What it costs: a sweep deletes at most 1,000 rows per statement, each
// batch a short transaction of its own (FOR UPDATE SKIP LOCKED, so it never
// waits on a row a request holds); a sweep that finds nothing costs one
// small indexed statement per table. With several replicas the tables are
// swept up to once per replica per interval.
//
// How it fails: a replica that finds another one sweeping skips its turn
// instead of waiting; one that dies mid-sweep holds no lock (the lock is
// transaction-scoped, so sweeping also works through PgBouncer in
// transaction pooling mode). Each batch is bounded to 30 s. A failed sweep
// is logged and the next interval tries again; a database that cannot be
// reached stops nothing but the sweep.
//
// Deleted rows are logged through slog and counted in the OpenTelemetry
// counter pglimit.housekeeping.deleted, with the attribute table.
package housekeeping

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/housekeep"
)

// Sweep deletes the lapsed rows of every limit table of pool's database
// once, unless another replica is sweeping, and returns the rows deleted
// per table (every table, zero included): heavy_permit, request_in_flight,
// upload_window, login_attempt, replica, api_request_window,
// refusal_minute, quota_usage, quota_ledger, ban and access_rule (the
// allow and deny lists' rules past their expiry). It returns a nil map
// when another replica held the housekeeping lock and this one left the
// sweep to it. On an error the rows deleted so far are in the map. It logs
// through slog.Default and counts through otel.GetMeterProvider.
func Sweep(ctx context.Context, pool *pgxpool.Pool) (map[string]int64, error) {
	h, err := housekeep.New(pool, housekeep.Options{})
	if err != nil {
		return nil, fmt.Errorf("housekeeping: %w", err)
	}
	res, err := h.RunOnce(ctx)
	if !res.Ran && err == nil {
		return nil, nil
	}
	return res.Deleted, err
}
