// Package pglimit makes request limits hold across every replica of a Go
// HTTP service by counting them in PostgreSQL, the database the service
// already has (ADR-0196).
//
// The limits are in their own packages, all of one shape (New with checked
// Options, Handler(next), Acquire(ctx, key) for code that is not HTTP, a
// *LimitError matching ErrLimited, a replaceable OnError):
// middleware/heavy (expensive endpoints), middleware/inflight (requests in
// flight per token), middleware/upload (uploads per rolling window),
// middleware/signin (failed sign-ins), middleware/ratelimit (request rate
// per key, GCRA). middleware/readroute sends history
// reads to a read replica, cursor pages deep history by key, nodelimit
// shares an outbound call rate between replicas, and permit is the leased
// slot under heavy, inflight and upload, usable on its own.
//
// This package is the small part they share: ErrLimited, which every
// refusal matches; Classify, which tells a database that cannot be reached
// from a statement that timed out from anything else; MaxLimit, the bound
// of every cap; Migrate, which creates pglimit's schema; Run, which runs
// what every replica runs in the background; and Refusals, every limit's
// refusals per minute across all replicas.
//
// Every limiter counts its decisions in the OpenTelemetry counter
// pglimit.decisions (attributes limit, outcome, scope; never a key) and
// times their database work in pglimit.decision.duration, through its
// Options.MeterProvider, and takes Options.DryRun: decide, count, log,
// refuse nobody.
package pglimit

import (
	"context"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/sql/schema"
)

// MaxLimit is the largest cap any pglimit limit accepts (a heavy
// endpoint's per-key cap and its installation cap, a token's requests in
// flight, uploads per window, failed sign-ins per window, a permit scope's
// slots). Every package refuses a larger one in New.
const MaxLimit = 10000

// Migrate brings pool's database to pglimit's latest schema: every table
// in the PostgreSQL schema pglimit (created here), goose's version table
// pglimit.goose_db_version beside them, the service's own tables and goose
// history untouched. It is safe to call from every replica at once: one
// migrates while the others wait. See package sql/schema for applying the
// migrations with goose yourself.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return schema.Migrate(ctx, pool)
}
