package app

import (
	"bytes"
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
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/problem"
)

const (
	maxSQLBytes      = 64 << 10 // the console's largest statement
	maxCellBytes     = 64 << 10 // a longer value is cut and marked, never decoded
	maxResponseBytes = 8 << 20  // the answer's encoded JSON; past this the result stops, as at the row cap
	// maxRowBytes bounds one row as the database sends it: the console's
	// connection refuses a longer message before reading its body, so no
	// row larger than this is ever held in memory, and the result stops
	// there, as at the row cap. Cells are cut at maxCellBytes, so only a
	// row of very many long cells reaches it.
	maxRowBytes = 2 * maxResponseBytes
)

// errResponseFull stops a console result at maxResponseBytes.
var errResponseFull = errors.New("console: the response reached its size cap")

// errConsoleParameters refuses a statement with parameters ($1): the
// console has no values to send for them.
var errConsoleParameters = errors.New("console: the statement has parameters")

type consoleRequest struct {
	SQL string `json:"sql"`
}

// handleConsole runs one read-only statement (POST /api/sql) on a
// connection of its own, logged in as the user's own console role
// (consoleConnect), in a read-only transaction with statement_timeout at
// what is left of the time bound; the extended protocol refuses several
// statements in one request. It stops at the row cap or the response's
// size cap (bound ROWS) or the time bound (bound TIME, or 503 when nothing
// was read yet). The connection is closed before the answer's first byte
// is written: a client that reads slowly, or not at all, holds no
// connection, transaction or lock of the database, only its permit until
// the write deadline (withWriteDeadline) drops it.
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
	// PostgreSQL's protocol ends a statement's text at a NUL: sent, the
	// rest of the message is garbage to the server, which drops the
	// connection (a protocol violation, not the statement's error).
	if strings.IndexByte(stmt, 0) >= 0 {
		invalidSQL(w, "The statement contains a NUL character (\\u0000), which PostgreSQL does not take in a statement's text.", "")
		return
	}
	id, _ := IdentityFrom(r.Context())
	var (
		res  = &consoleResult{}
		mark heavy.Mark
	)
	// The statement may change its session beyond the transaction (SET,
	// SET ROLE, session advisory locks, WITH HOLD cursors, LISTEN): its
	// connection is never reused.
	conn := &throwawayConn{connect: func(ctx context.Context) (*pgx.Conn, func(), error) { return a.consoleConnect(ctx, id.Username) }}
	defer conn.close()
	err := heavy.Read(r.Context(), conn, func(tx pgx.Tx) error {
		if err := a.consoleEnter(r.Context(), tx); err != nil {
			return err
		}
		// The operator's statement is the one SQL string of this service
		// that sqlc cannot know: it is the console's input. It is prepared
		// (the extended protocol, which takes exactly one statement), so
		// that a statement with parameters, for which the console has no
		// values, is refused as such before it runs; the query then runs
		// the prepared statement.
		sd, err := tx.Conn().Prepare(r.Context(), stmt, stmt)
		if err != nil {
			return err
		}
		if len(sd.ParamOIDs) > 0 {
			return errConsoleParameters
		}
		rows, err := tx.Query(r.Context(), stmt)
		if err != nil {
			return err
		}
		res.begin(rows.FieldDescriptions())
		mark, err = heavy.Stream(r.Context(), rows, res.add)
		var tooLong *pgproto3.ExceededMaxBodyLenErr
		if errors.Is(err, errResponseFull) || errors.As(err, &tooLong) {
			// Stream stopped the statement in the database, as at the row
			// cap; a row past maxRowBytes was refused unread and its
			// connection is lost, which loses nothing read.
			mark.Bound, err = heavy.BoundRows, nil
		}
		return err
	})
	// The connection, its transaction and whatever the statement took in
	// its session end here, before the answer's first byte.
	conn.close()
	if err != nil {
		var pgErr *pgconn.PgError
		switch {
		case errors.Is(err, errConsoleParameters):
			invalidSQL(w, "Parameters ($1, $2, …) are not supported: the console sends a statement without values for them. Write the values into the statement.", "")
		case errors.As(err, &pgErr) && pgErr.Code == "53400": // configuration_limit_exceeded
			// temp_file_limit (-sql-console-temp-file-limit): the
			// statement's own size, as at its time bound; the same
			// statement fails again.
			invalidSQL(w, "The statement needs more temporary file space than a console statement may use (temp_file_limit, -sql-console-temp-file-limit): "+pgErr.Message, pgErr.Code)
		case errors.As(err, &pgErr) && userSQLError(pgErr):
			invalidSQL(w, "The statement failed: "+pgErr.Message, pgErr.Code)
		default:
			a.heavyError(w, r, err)
		}
		return
	}
	if mark.Bound == heavy.BoundTime && mark.Rows == 0 {
		heavy.WriteError(w, r, heavy.ErrTimedOut)
		return
	}
	var bound *string
	if mark.Bound != "" {
		bound = &mark.Bound
	}
	body := res.finish(bound)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(body)
}

// consoleResult is the console's answer, {"columns","rows","bound"},
// encoded as its rows arrive, so that its size cap counts the bytes sent.
type consoleResult struct {
	buf   bytes.Buffer
	rows  int
	begun bool
}

// consoleTail is room kept for the answer's end (finish).
const consoleTail = len(`],"bound":"ROWS"}` + "\n")

func (c *consoleResult) begin(fields []pgconn.FieldDescription) {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.Name
	}
	b, _ := json.Marshal(names)
	c.buf.WriteString(`{"columns":`)
	c.buf.Write(b)
	c.buf.WriteString(`,"rows":[`)
	c.begun = true
}

// add encodes the current row of rows, one cell at a time: a value longer
// than maxCellBytes is cut from its raw bytes and never decoded, so a cell
// costs memory in proportion to its cut size. A row that would take the
// answer past maxResponseBytes stops the result (errResponseFull).
func (c *consoleResult) add(rows pgx.Rows) error {
	fields, raws := rows.FieldDescriptions(), rows.RawValues()
	m := rows.Conn().TypeMap()
	room := maxResponseBytes - consoleTail - c.buf.Len() - 1
	row := make([]byte, 0, 64)
	row = append(row, '[')
	for i := range fields {
		if i > 0 {
			row = append(row, ',')
		}
		v, err := cellValue(m, &fields[i], raws[i])
		if err != nil {
			return err
		}
		cell, err := json.Marshal(jsonValue(v))
		if err != nil {
			cell, _ = json.Marshal(cut(fmt.Sprint(v)))
		}
		if row = append(row, cell...); len(row) >= room {
			return errResponseFull
		}
	}
	if row = append(row, ']'); len(row) >= room {
		return errResponseFull
	}
	if c.rows > 0 {
		c.buf.WriteByte(',')
	}
	c.buf.Write(row)
	c.rows++
	return nil
}

// finish ends the answer with its bound and returns it.
func (c *consoleResult) finish(bound *string) []byte {
	if !c.begun {
		c.buf.WriteString(`{"columns":[],"rows":[`)
	}
	b, _ := json.Marshal(bound)
	c.buf.WriteString(`],"bound":`)
	c.buf.Write(b)
	c.buf.WriteString("}\n")
	return c.buf.Bytes()
}

// cutCell is a value already cut from its raw bytes; jsonValue writes it
// as it is.
type cutCell string

// cellValue decodes one raw value as rows.Values would, unless it is longer
// than maxCellBytes: then it is cut before any decoding (cutRaw).
func cellValue(m *pgtype.Map, fd *pgconn.FieldDescription, raw []byte) (any, error) {
	switch {
	case raw == nil:
		return nil, nil
	case len(raw) > maxCellBytes:
		return cutRaw(fd, raw), nil
	}
	if dt, ok := m.TypeForOID(fd.DataTypeOID); ok {
		return dt.Codec.DecodeValue(m, fd.DataTypeOID, fd.Format, raw)
	}
	if fd.Format == pgx.TextFormatCode {
		return string(raw), nil
	}
	return bytes.Clone(raw), nil
}

// cutRaw stands for a value longer than maxCellBytes without decoding it:
// text (any value sent as text, and the text types, json and xml in
// binary) is cut as cut cuts a decoded string; a byte string is written
// as its first maxCellBytes, as jsonValue writes a decoded one; any other
// value (an array, a composite, a range) is the cut mark alone.
func cutRaw(fd *pgconn.FieldDescription, raw []byte) any {
	text := func(b []byte) any { return cutCell(cut(string(b[:min(len(b), maxCellBytes+utf8.UTFMax)]))) }
	switch {
	case fd.Format == pgx.TextFormatCode:
		return text(raw)
	case fd.DataTypeOID == pgtype.ByteaOID:
		return raw[:maxCellBytes]
	case fd.DataTypeOID == pgtype.JSONBOID && raw[0] == 1: // binary jsonb: a version byte, then text
		return text(raw[1:])
	}
	switch fd.DataTypeOID {
	case pgtype.TextOID, pgtype.VarcharOID, pgtype.BPCharOID, pgtype.NameOID, pgtype.JSONOID, pgtype.XMLOID, pgtype.UnknownOID:
		return text(raw)
	}
	return cutCell(cutMark)
}

// throwawayConn is a heavy.Beginner that opens a connection of its own
// for one transaction; close closes it.
type throwawayConn struct {
	connect func(context.Context) (*pgx.Conn, func(), error)
	conn    *pgx.Conn
	release func()
}

func (c *throwawayConn) BeginTx(ctx context.Context, opts pgx.TxOptions) (pgx.Tx, error) {
	conn, release, err := c.connect(ctx)
	if err != nil {
		return nil, err
	}
	c.conn, c.release = conn, release
	return conn.BeginTx(ctx, opts)
}

// close closes the connection, if one was opened and is still open.
func (c *throwawayConn) close() {
	if c.conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = c.conn.Close(ctx)
	if c.release != nil {
		c.release() // a closed pool connection is destroyed, not pooled
	}
	c.conn, c.release = nil, nil
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
	case cutCell:
		return string(x)
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
	return s + cutMark
}

// cutMark ends a value the console cut.
const cutMark = "…[cut]"
