package heavy

import (
	"context"
	"errors"
	"fmt"

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

// Partial reports whether a bound stopped the export.
func (m Mark) Partial() bool { return m.Bound != "" }

// String is the export's last line: "#complete rows=N",
// "#partial bound=ROWS limit=L rows=N" or "#partial bound=TIME limit=30s rows=N".
func (m Mark) String() string {
	if !m.Partial() {
		return fmt.Sprintf("#complete rows=%d", m.Rows)
	}
	return fmt.Sprintf("#partial bound=%s limit=%s rows=%d", m.Bound, m.Limit, m.Rows)
}

// Stream hands rows to write until they end, the row cap of ctx's heavy
// request is reached, or its time bound stops the query, and says which in
// the Mark. Query one row more than the cap (LIMIT cap + 1): Stream stops at
// the cap and reports ROWS only when a row beyond it exists. Stream closes
// rows. An error other than the time bound (the client went away, the
// database failed) is returned with the Mark of what was written.
func Stream(ctx context.Context, rows pgx.Rows, write func(pgx.Rows) error) (Mark, error) {
	defer rows.Close()
	b, _ := FromContext(ctx)
	var m Mark
	for rows.Next() {
		if b.Rows > 0 && m.Rows >= b.Rows {
			m.Bound, m.Limit = BoundRows, fmt.Sprint(b.Rows)
			return m, nil
		}
		if err := write(rows); err != nil {
			return m, err
		}
		m.Rows++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		if dberr.IsTimeout(err) && !errors.Is(ctx.Err(), context.Canceled) {
			m.Bound, m.Limit = BoundTime, FormatLimit(b.Time)
			return m, nil
		}
		return m, err
	}
	return m, nil
}
