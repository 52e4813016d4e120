package heavy

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/respond"
	"github.com/pglimit/pglimit/problem"
)

// ErrTimedOut is matched (errors.Is) by every *TimeoutError.
var ErrTimedOut = errors.New("heavy: time bound reached")

// TimeoutError is a read the database stopped at the time bound.
type TimeoutError struct {
	// Endpoint is the endpoint's name.
	Endpoint string
	// Limit is the time bound.
	Limit time.Duration
	// Err is the database's error.
	Err error
}

func (e *TimeoutError) Error() string {
	return fmt.Sprintf("heavy: %s: stopped at its time bound of %s", e.Endpoint, FormatLimit(e.Limit))
}

// Is reports whether target is ErrTimedOut.
func (e *TimeoutError) Is(target error) bool { return target == ErrTimedOut }

// Unwrap returns the database's error.
func (e *TimeoutError) Unwrap() error { return e.Err }

// Beginner starts transactions: a *pgxpool.Pool or a *pgx.Conn.
type Beginner interface {
	BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error)
}

var queries = db.New()

// Read runs fn in a read-only transaction on conn whose statement_timeout is
// what is left of ctx's time bound, so the database stops a statement at the
// bound even if the client stops reading. When the bound stops the read it
// returns a *TimeoutError (errors.Is(err, ErrTimedOut)). Outside a heavy
// request (no Bounds in ctx) it runs fn with ctx's deadline alone.
func Read(ctx context.Context, conn Beginner, fn func(pgx.Tx) error) error {
	b, _ := FromContext(ctx)
	timedOut := func(err error) error {
		return &TimeoutError{Endpoint: b.Endpoint, Limit: b.Time, Err: err}
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
		if err := queries.SessionSetStatementTimeout(ctx, tx, ms); err != nil {
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
//   - *LimitError: 429 too-many-heavy-requests naming endpoint, limit and
//     scope, with Retry-After and the RateLimit-Policy / RateLimit headers;
//   - *TimeoutError: 503 heavy-request-timed-out with endpoint, bound TIME
//     and limit;
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, pglimit.ClassTimeout): 503
//     database-unavailable with Retry-After;
//   - a client that went away (pglimit.ClassCanceled): nothing;
//   - anything else: 500 internal-error, without the error's text.
//
// It logs nothing: log the error before you call it (the Handler does).
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		le *LimitError
		te *TimeoutError
	)
	switch {
	case errors.As(err, &le):
		writeRefusal(w, r, le)
	case errors.As(err, &te):
		problem.Write(w, &problem.Details{
			Slug:     SlugTimedOut,
			Title:    "Heavy request timed out",
			Status:   http.StatusServiceUnavailable,
			Detail:   fmt.Sprintf("The database stopped this %s request at its time bound of %s before it had a page to return. Narrow the request (a shorter time range) and try again.", te.Endpoint, FormatLimit(te.Limit)),
			Instance: r.URL.Path,
			Extensions: map[string]any{
				"endpoint": te.Endpoint,
				"bound":    BoundTime,
				"limit":    FormatLimit(te.Limit),
			},
		})
	default:
		respond.Database(w, r, err)
	}
}
