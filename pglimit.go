// Package pglimit makes request limits hold across every replica of a Go
// HTTP service by counting them in PostgreSQL, the database the service
// already has: no Redis, no sidecar. It implements the decision record
// ADR-0196 (docs/ADR-0196.txt in the repository).
//
// The limits are in their own packages, all of one shape (New with checked
// Options, Acquire(ctx, key) returning a Permit or a refusal matching
// ErrLimited, and an HTTP face with Handler(next) and a replaceable
// OnError): middleware/heavy (expensive endpoints), middleware/inflight
// (requests in flight per token), middleware/upload (uploads per rolling
// window), middleware/signin (failed sign-ins); ratelimit (request rate per
// key, GCRA) and quota (per calendar period) are engines without net/http,
// whose HTTP faces are middleware/ratelimit and middleware/quota. The
// first four return the values of package limit: a *limit.Permit (heavy,
// inflight, upload) and a *limit.Refusal, the same for all four; the rate
// and a quota, which charge amounts, a Permit and a LimitError of their own.
// middleware/readroute sends history reads to a read replica, cursor pages
// deep history by key, nodelimit shares an outbound call rate between
// replicas, override keeps limits as data, and pgtest is a test kit (a
// migrated database per test); ban refuses, on every replica and from
// memory, a key a rate limit refused too often (ratelimit.Options.Ban).
// access keeps allow and deny lists as data, in force on every replica
// within a second, matched in memory; middleware/rules denies (403) and
// exempts by them.
//
// This package is the small part they share: ErrLimited, which every
// refusal matches; Classify, which tells a database that cannot be reached
// from a statement that timed out from anything else; MaxLimit, the bound
// of every cap; Migrate, which creates pglimit's schema; Run, which runs
// what every replica runs in the background (the replica registry's
// heartbeat, housekeeping, the listener of invalidations); and Refusals,
// every limit's refusals per minute across all replicas.
//
// What it guarantees: every permit and counter is a row of an UNLOGGED
// table in the schema pglimit, apart from the service's own tables, taken
// or counted in one atomic statement, so two replicas never take the same
// slot nor lose each other's counts. Every row lapses at a time it
// carries, computed on the database clock, never on a replica's: a replica
// that dies holds nothing for long.
//
// What it costs: a few small statements on the service's own pool per
// limited request (each limiter's package says which), and the background
// work of Run: a heartbeat every 5 s and a sweep every minute per replica,
// and one connection per replica held open for LISTEN.
//
// How it fails: a crash of the database empties the UNLOGGED tables, and
// the limits start again from zero — the safe direction for a permit, a
// short reprieve for a throttle. A database that cannot be reached is
// ClassUnavailable; each limiter's package says whether it then refuses or
// lets requests through, and its default OnError answers 503. No error
// text of the database reaches a client.
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

	"github.com/pglimit/pglimit/internal/migrate"
	"github.com/pglimit/pglimit/internal/vocab"
)

// MaxLimit is the largest cap any pglimit limit accepts (a heavy
// endpoint's per-key cap and its installation cap, a token's requests in
// flight, uploads per window, failed sign-ins per window, a permit scope's
// slots). Every package refuses a larger one in New. (Defined in
// internal/vocab with ErrLimited and Classify; re-exported here.)
const MaxLimit = vocab.MaxLimit

// Migrate brings pool's database to pglimit's latest schema: every table
// in the PostgreSQL schema pglimit (created here), goose's version table
// pglimit.goose_db_version beside them, the service's own tables and goose
// history untouched. It is safe to call from every replica at once: one
// migrates while the others wait. On a Citus coordinator (the extension
// citus installed in the database) it then distributes the limit tables by
// their key or scope, colocated, and every decision runs on its key's
// shard (docs/scaling.md, "Beyond one primary"). See package sql/schema
// for applying the migrations with goose yourself.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return migrate.Limits(ctx, pool)
}
