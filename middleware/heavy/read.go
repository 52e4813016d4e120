package heavy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/session"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/problem"
)

// ErrTimedOut is matched (errors.Is) by the error of a read the database
// stopped at its time bound (Read, Stream). WriteError answers it 503
// heavy-request-timed-out; a handler may also pass ErrTimedOut itself.
var ErrTimedOut = errors.New("heavy: time bound reached")

// timeoutError is a read the database stopped at the time bound.
type timeoutError struct {
	endpoint string
	limit    time.Duration
	err      error // the database's
}

func (e *timeoutError) Error() string {
	return fmt.Sprintf("heavy: %s: stopped at its time bound of %s", e.endpoint, formatLimit(e.limit))
}

func (e *timeoutError) Is(target error) bool { return target == ErrTimedOut }

func (e *timeoutError) Unwrap() error { return e.err }

// Beginner starts transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

// Read runs fn in a read-only transaction on conn whose statement_timeout is
// what is left of ctx's time bound, so the database stops a statement at the
// bound even if the client stops reading. When the bound stops the read it
// returns an error matching ErrTimedOut. Outside a heavy
// request (no Bounds in ctx) it runs fn with ctx's deadline alone.
func Read(ctx context.Context, conn Beginner, fn func(pgx.Tx) error) error {
	b, _ := FromContext(ctx)
	timedOut := func(err error) error {
		return &timeoutError{endpoint: b.Endpoint, limit: b.Time, err: err}
	}
	deadline, hasDeadline := ctx.Deadline()
	if hasDeadline && time.Until(deadline) <= 0 {
		return timedOut(context.DeadlineExceeded)
	}
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		if hasDeadline && ctx.Err() != nil {
			return timedOut(err)
		}
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if hasDeadline {
		// The database stops the statement a moment before the context's
		// deadline would: a canceled statement keeps its connection, while
		// a connection interrupted by the deadline may be closed by pgx.
		left := time.Until(deadline)
		ms := max(1, (left - min(100*time.Millisecond, left/10)).Milliseconds())
		if err := session.SetStatementTimeout(ctx, tx, ms); err != nil {
			if dberr.IsTimeout(err) {
				return timedOut(err)
			}
			return err
		}
	}
	if err := fn(tx); err != nil {
		if !errors.Is(ctx.Err(), context.Canceled) && dberr.IsTimeout(err) {
			return timedOut(err)
		}
		return err
	}
	// The transaction only read: what fn read stands whatever its end
	// says. A stream stopped by its time bound, or stopped early by Stream
	// (its row cap), ended in a canceled statement, so the aborted
	// transaction rolls back (or its connection is gone), which loses
	// nothing.
	end, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	_ = tx.Commit(end)
	return nil
}

// WriteError answers a failed heavy request; it is the default
// Options.OnError, and a handler calls it for what Read and Stream return:
//
//   - *limit.Refusal: 429 too-many-heavy-requests naming endpoint, limit and
//     scope, with Retry-After and the RateLimit-Policy / RateLimit headers;
//   - ErrTimedOut: 503 heavy-request-timed-out with endpoint, bound TIME
//     and limit (the request's Bounds, FromContext, when the error does
//     not carry them);
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     database-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: log the error before you call it (the Handler does).
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		le *limit.Refusal
		te *timeoutError
	)
	switch {
	case errors.As(err, &le) && le.Kind == kindHeavy:
		writeRefusal(w, r, le)
	case errors.Is(err, ErrTimedOut):
		endpoint, limit := "", time.Duration(0)
		if b, ok := FromContext(r.Context()); ok {
			endpoint, limit = b.Endpoint, b.Time
		}
		if errors.As(err, &te) {
			endpoint, limit = te.endpoint, te.limit
		}
		problem.Write(w, &problem.Details{
			Slug:     slugTimedOut,
			Title:    "Heavy request timed out",
			Status:   http.StatusServiceUnavailable,
			Detail:   fmt.Sprintf("The database stopped this %s request at its time bound of %s before it had a page to return. Narrow the request (a shorter time range) and try again.", endpoint, formatLimit(limit)),
			Instance: r.URL.Path,
			Extensions: map[string]any{
				"endpoint": endpoint,
				"bound":    BoundTime,
				"limit":    formatLimit(limit),
			},
		})
	default:
		respond.Database(w, r, err)
	}
}
