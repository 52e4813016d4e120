package heavy

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/dberr"
)

// Bounds that can stop a streamed export, as its mark names them.
const (
	BoundRows = "ROWS"
	BoundTime = "TIME"
)

// Mark ends a streamed export and says whether it is complete.
type Mark struct {
	// Rows is the number of rows written.
	Rows int
	// Bound is "" for a complete export, BoundRows or BoundTime for one
	// stopped by that bound.
	Bound string
	// Limit is the bound's value as the mark writes it: the row cap ("1000")
	// or the time bound ("30s"); "" when complete.
	Limit string
}

// String is the export's last line: "#complete rows=N",
// "#partial bound=ROWS limit=L rows=N" or "#partial bound=TIME limit=30s rows=N".
func (m Mark) String() string {
	if m.Bound == "" {
		return fmt.Sprintf("#complete rows=%d", m.Rows)
	}
	return fmt.Sprintf("#partial bound=%s limit=%s rows=%d", m.Bound, m.Limit, m.Rows)
}

// Stream hands rows to write until they end, the row cap of ctx's heavy
// request is reached, or its time bound stops the query, and says which in
// the Mark. Query one row more than the cap (LIMIT cap + 1) where the query
// allows it: Stream stops at the cap and reports ROWS only when a row beyond
// it exists. Stream closes rows.
//
// When Stream stops before the rows end (the row cap, or write returned an
// error) it stops the statement in the database: it sends a cancel request
// for the statement and reads what the server had already sent, so the
// database stops producing rows nobody reads and the connection is free at
// once (pgx's Rows.Close alone would read the result to its end). The
// transaction the statement ran in is then aborted: it only read, so what
// was read stands; Read rolls it back.
//
// An error of write is returned as it is, with the Mark of what was
// written. Any other error than the time bound (the client went away, the
// database failed) is returned with the Mark of what was written.
func Stream(ctx context.Context, rows pgx.Rows, write func(pgx.Rows) error) (Mark, error) {
	defer rows.Close()
	b, _ := FromContext(ctx)
	var m Mark
	for rows.Next() {
		if b.Rows > 0 && m.Rows >= b.Rows {
			m.Bound, m.Limit = BoundRows, fmt.Sprint(b.Rows)
			stopStatement(ctx, rows)
			return m, nil
		}
		if err := write(rows); err != nil {
			stopStatement(ctx, rows)
			return m, err
		}
		m.Rows++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		if dberr.IsTimeout(err) && !errors.Is(ctx.Err(), context.Canceled) {
			m.Bound, m.Limit = BoundTime, formatLimit(b.Time)
			return m, nil
		}
		return m, err
	}
	return m, nil
}

// cancelTimeout bounds the cancel request of a statement Stream stops.
const cancelTimeout = 2 * time.Second

// stopStatement stops the statement rows reads, before the result ends: a
// cancel request on a connection of its own (the server stops the statement
// at its next interrupt check and answers 57014), then Close reads what was
// already on its way. A cancel that arrives after the statement ended finds
// the session idle, waiting for its next command, and the server ignores it
// there; the next command is sent only after Close returns. If the cancel
// request cannot be sent (the database does not answer), Close reads on
// under ctx's deadline, as it would have without it.
func stopStatement(ctx context.Context, rows pgx.Rows) {
	conn := rows.Conn()
	if conn == nil || conn.PgConn() == nil {
		rows.Close()
		return
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cancelTimeout)
	defer cancel()
	_ = conn.PgConn().CancelRequest(cctx)
	rows.Close()
}
