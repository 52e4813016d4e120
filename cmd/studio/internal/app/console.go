package app

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/problem"
)

const (
	maxSQLBytes      = 64 << 10 // the console's largest statement
	maxCellBytes     = 64 << 10 // a longer value is cut and marked
	maxResponseBytes = 8 << 20  // past this the result stops, as at the row cap
)

// errResponseFull stops a console result at maxResponseBytes.
var errResponseFull = errors.New("console: the response reached its size cap")

type consoleRequest struct {
	SQL string `json:"sql"`
}

type consoleResponse struct {
	Columns []string `json:"columns"`
	Rows    [][]any  `json:"rows"`
	Bound   *string  `json:"bound"`
}

// handleConsole runs one read-only statement (POST /api/sql). It runs in a
// read-only transaction on a connection that logged in as studio_console
// (a role that may only read the history tables) when there is one,
// with statement_timeout at what is left of the time bound; the extended
// protocol refuses several statements in one request. It stops at the row
// cap (bound ROWS) or the time bound (bound TIME, or 503 when nothing was
// read yet).
func (a *App) handleConsole(w http.ResponseWriter, r *http.Request) {
	b, _ := heavy.FromContext(r.Context())
	// The body is read under the permits: one still arriving at the time
	// bound stops arriving (400), so a client that sends it a byte at a time
	// holds them no longer than any console query. The deadline is lifted
	// once the body is in, before the server's own read of the connection
	// could take it for a client gone.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(b.Deadline)
	var req consoleRequest
	ok := decodeJSON(w, r, &req, maxSQLBytes)
	_ = rc.SetReadDeadline(time.Time{})
	if !ok {
		return
	}
	stmt := strings.TrimSpace(req.SQL)
	if stmt == "" {
		invalidSQL(w, "The sql member is empty.", "")
		return
	}
	var (
		resp  = consoleResponse{Columns: []string{}, Rows: [][]any{}}
		mark  heavy.Mark
		bytes int
	)
	// The statement may change its session beyond the transaction (SET,
	// SET ROLE, session advisory locks, WITH HOLD cursors, LISTEN): its
	// connection is closed after it, never returned to the pool.
	pool := a.console
	if pool == nil {
		pool = a.primary
	}
	conn := &throwawayConn{pool: pool}
	defer conn.close()
	err := heavy.Read(r.Context(), conn, func(tx pgx.Tx) error {
		if a.console == nil && a.consoleRole {
			if err := a.q.ConsoleEnterRole(r.Context(), tx); err != nil {
				return err
			}
		}
		// The operator's statement is the one SQL string of this service
		// that sqlc cannot know: it is the console's input. DescribeExec
		// uses the extended protocol, which runs exactly one statement.
		rows, err := tx.Query(r.Context(), stmt, pgx.QueryExecModeDescribeExec)
		if err != nil {
			return err
		}
		for _, f := range rows.FieldDescriptions() {
			resp.Columns = append(resp.Columns, f.Name)
		}
		mark, err = heavy.Stream(r.Context(), rows, func(rows pgx.Rows) error {
			vals, err := rows.Values()
			if err != nil {
				return err
			}
			row := make([]any, len(vals))
			for i, v := range vals {
				row[i] = jsonValue(v)
				bytes += approxSize(row[i])
			}
			resp.Rows = append(resp.Rows, row)
			if bytes > maxResponseBytes {
				return errResponseFull
			}
			return nil
		})
		if errors.Is(err, errResponseFull) {
			// Stream stopped the statement in the database, as at the
			// row cap.
			mark.Bound, err = heavy.BoundRows, nil
		}
		return err
	})
	if err != nil {
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && userSQLError(pgErr) {
			invalidSQL(w, "The statement failed: "+pgErr.Message, pgErr.Code)
			return
		}
		a.heavyError(w, r, err)
		return
	}
	if mark.Bound == heavy.BoundTime && mark.Rows == 0 {
		heavy.WriteError(w, r, heavy.ErrTimedOut)
		return
	}
	if mark.Partial() {
		bound := mark.Bound
		resp.Bound = &bound
	}
	writeJSON(w, http.StatusOK, resp)
}

// throwawayConn is a heavy.Beginner that takes a connection from the pool
// for one transaction; close closes that connection and gives its place
// back to the pool, which then opens a fresh one when it needs one. The
// connection counts against the pool's size while it is used.
type throwawayConn struct {
	pool *pgxpool.Pool
	conn *pgxpool.Conn
}

func (c *throwawayConn) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	pc, err := c.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	c.conn = pc
	return pc.BeginTx(ctx, opts)
}

func (c *throwawayConn) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.conn.Conn().Close(ctx)
	c.conn.Release() // a closed connection is destroyed, not pooled
}

// userSQLError reports whether the database refused the operator's
// statement itself (its syntax, its names, its types, a write in a
// read-only transaction, a privilege), which the operator may read; any
// other failure stays in the log.
func userSQLError(e *pgconn.PgError) bool {
	switch {
	case e.Code == "57014": // canceled: the time bound, answered as such
		return false
	case strings.HasPrefix(e.Code, "42"), // syntax error or access rule violation
		strings.HasPrefix(e.Code, "22"), // data exception
		strings.HasPrefix(e.Code, "0A"), // feature not supported
		strings.HasPrefix(e.Code, "21"), // cardinality violation
		strings.HasPrefix(e.Code, "54"), // program limit exceeded: a NUL character, too many columns, too complex
		strings.HasPrefix(e.Code, "2B"), strings.HasPrefix(e.Code, "2F"),
		strings.HasPrefix(e.Code, "38"), strings.HasPrefix(e.Code, "39"),
		strings.HasPrefix(e.Code, "P0"), // raised by the statement
		e.Code == "25006",               // read-only transaction
		e.Code == "25001",               // active transaction (SET TRANSACTION ...)
		e.Code == "0B000",               // invalid transaction initiation
		e.Code == "3D000", e.Code == "3F000":
		return true
	}
	return false
}

func invalidSQL(w http.ResponseWriter, detail, code string) {
	d := &problem.Details{Slug: "invalid-sql", Title: "Invalid SQL", Status: http.StatusBadRequest, Detail: detail}
	if code != "" {
		d.Extensions = map[string]any{"sqlstate": code}
	}
	problem.Write(w, d)
}

// jsonValue turns a value pgx decoded into something encoding/json writes
// faithfully: byte strings as base64, numerics as exact strings, long text
// cut at maxCellBytes.
func jsonValue(v any) any {
	switch x := v.(type) {
	case nil, bool, int16, int32, int64:
		return x
	case float32:
		return jsonFloat(float64(x), x)
	case float64:
		return jsonFloat(x, x)
	case string:
		return cut(x)
	case []byte:
		return base64.StdEncoding.EncodeToString(x[:min(len(x), maxCellBytes)])
	case time.Time:
		return x.UTC().Format(time.RFC3339Nano)
	case pgtype.Numeric:
		if !x.Valid {
			return nil
		}
		if x.NaN {
			return "NaN"
		}
		if x.Int == nil {
			return "0"
		}
		return numericString(x.Int, x.Exp)
	case [16]byte:
		return fmt.Sprintf("%x-%x-%x-%x-%x", x[0:4], x[4:6], x[6:8], x[8:10], x[10:16])
	case map[string]any, []any:
		b, err := json.Marshal(x)
		if err != nil {
			return cut(fmt.Sprint(x))
		}
		if len(b) > maxCellBytes {
			return cut(string(b))
		}
		return json.RawMessage(b)
	default:
		if s, ok := v.(fmt.Stringer); ok {
			return cut(s.String())
		}
		b, err := json.Marshal(x)
		if err != nil || len(b) > maxCellBytes {
			return cut(fmt.Sprint(x))
		}
		return json.RawMessage(b)
	}
}

// jsonFloat writes NaN and the infinities, which JSON has no number for,
// as PostgreSQL spells them ("NaN", "Infinity", "-Infinity"), as a NaN
// numeric is written; encoding/json would fail on them and cut the response.
func jsonFloat(f float64, v any) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	return v
}

func numericString(i *big.Int, exp int32) string {
	s := new(big.Int).Abs(i).String()
	neg := i.Sign() < 0
	if exp > 0 {
		s += strings.Repeat("0", int(exp))
	} else if exp < 0 {
		n := int(-exp)
		if len(s) <= n {
			s = strings.Repeat("0", n-len(s)+1) + s
		}
		s = s[:len(s)-n] + "." + s[len(s)-n:]
	}
	if neg {
		s = "-" + s
	}
	return s
}

func cut(s string) string {
	if len(s) <= maxCellBytes {
		return strings.ToValidUTF8(s, "\uFFFD")
	}
	s = s[:maxCellBytes]
	for !utf8.ValidString(s) && len(s) > 0 {
		s = s[:len(s)-1]
	}
	return s + "…[cut]"
}

func approxSize(v any) int {
	switch x := v.(type) {
	case string:
		return len(x) + 2
	case json.RawMessage:
		return len(x)
	default:
		return 8
	}
}
