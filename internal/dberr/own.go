package dberr

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// errOwnDeadline is the cause of a context that WithTimeout ended.
var errOwnDeadline = errors.New("pglimit: the limiter's Timeout expired")

// WithTimeout is context.WithTimeout for a limiter's own Timeout option
// (its bound on the database work of one decision): when this bound, not
// an earlier deadline of ctx, ends the returned context, OwnTimeout can
// tell.
func WithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeoutCause(ctx, d, errOwnDeadline)
}

// ownTimeout marks an error caused by a limiter's own Timeout, not by the
// caller's context: the database did not answer in time, which
// pglimit.Classify reports as unavailable.
type ownTimeout struct{ err error }

func (e *ownTimeout) Error() string { return "database did not answer in time: " + e.err.Error() }
func (e *ownTimeout) Unwrap() error { return e.err }

// OwnTimeout returns err marked as caused by the limiter's own Timeout when
// ctx (made by WithTimeout) ended by that bound; otherwise err itself.
func OwnTimeout(ctx context.Context, err error) error {
	if err == nil || IsOwnTimeout(err) || !errors.Is(context.Cause(ctx), errOwnDeadline) {
		return err
	}
	return &ownTimeout{err: err}
}

// IsOwnTimeout reports whether err was marked by OwnTimeout.
func IsOwnTimeout(err error) bool {
	var o *ownTimeout
	return errors.As(err, &o)
}

// IsConnectError reports whether err is a failed connect (pgconn's
// ConnectError), whatever stopped it.
func IsConnectError(err error) bool {
	var c *pgconn.ConnectError
	return errors.As(err, &c)
}

// LockNotAvailable is SQLSTATE 55P03: lock_timeout passed, or NOWAIT found
// the lock taken.
const LockNotAvailable = "55P03"

// LockTimeout returns err marked as the limiter's own Timeout (unavailable,
// as pglimit.Classify tells it) when it is SQLSTATE 55P03: a statement of
// the limiter's that sets lock_timeout from its Timeout could not have its
// turn in time. Any other err is returned as it is.
func LockTimeout(err error) error {
	var pg *pgconn.PgError
	if err == nil || IsOwnTimeout(err) || !errors.As(err, &pg) || pg.Code != LockNotAvailable {
		return err
	}
	return &ownTimeout{err: err}
}
