package pglimit

import "github.com/pglimit/pglimit/internal/vocab"

// The names of this file are defined in internal/vocab, the leaf every
// package of the library imports for them (none imports this package);
// here they are re-exported, the same values, for adopters.

// ErrLimited is matched (errors.Is) by every refusal of every limiter:
// *limit.Refusal (heavy, inflight, upload, signin),
// *ratelimit.LimitError and *quota.LimitError. Use errors.As with that
// type for its fields (the limit, the scope, when to retry).
var ErrLimited = vocab.ErrLimited

// ErrInvalidCost is matched by the error of a cost the rate
// (ratelimit.Limiter.AcquireN, Permit.Settle) or a quota cannot charge: a
// negative one, or, for a quota, one above quota.MaxLimit. It is the
// caller's mistake, not the client's.
var ErrInvalidCost = vocab.ErrInvalidCost

// ErrSettled is returned by a second Settle of one ratelimit.Permit or
// quota.Permit.
var ErrSettled = vocab.ErrSettled

// Class is what kind of failure a database error is, as Classify tells it.
// Its value is its name, ready for a log line or a metric attribute.
type Class = vocab.Class

const (
	// ClassNone is no error at all.
	ClassNone Class = vocab.ClassNone
	// ClassCanceled is the caller's context canceled: a client went away.
	// It is not a server error and is not logged as one.
	ClassCanceled Class = vocab.ClassCanceled
	// ClassUnavailable is a database that cannot be reached: a failed
	// connect, a broken connection, a server shutting down or starting up,
	// too many connections, a primary that became read-only in a failover
	// (SQLSTATE 25006), a serialization failure or deadlock the database
	// rolled back (40001, 40P01), or a limiter's own Timeout option
	// expired while it connected or waited: the database cannot decide
	// now. Answer 503 with Retry-After; it passes.
	ClassUnavailable Class = vocab.ClassUnavailable
	// ClassTimeout is a statement stopped at its time bound:
	// statement_timeout (SQLSTATE 57014) or a context deadline.
	ClassTimeout Class = vocab.ClassTimeout
	// ClassOther is any other error: a bug, a constraint, a syntax error.
	// Answer 500 and log it; never send its text to a client.
	ClassOther Class = vocab.ClassOther
)

// Classify tells what kind of failure err is, for every error pglimit
// returns and for the pgx errors of a service's own queries. It looks, in
// this order, for: nil; context.Canceled; a limiter's own Timeout or a
// failed connect (unavailable); a context deadline or SQLSTATE 57014
// (timeout); a connection-class or resource SQLSTATE (08, 57 other than
// 57014, 53), a read-only transaction (25006, a demoted primary), a
// serialization failure or deadlock (40001, 40P01), a network error or a
// closed connection (unavailable).
// Everything else is ClassOther.
func Classify(err error) Class { return vocab.Classify(err) }
