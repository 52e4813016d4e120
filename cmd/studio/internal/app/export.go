package app

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/readroute"
)

var (
	beginningOfTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
	endOfTime       = time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC)
)

// timeRange reads ?from= and ?to= (RFC 3339; both optional). A bad value
// is answered 400 invalid-time-range and ok is false.
func timeRange(w http.ResponseWriter, r *http.Request) (from, to time.Time, ok bool) {
	from, to = beginningOfTime, endOfTime
	q := r.URL.Query()
	for _, p := range []struct {
		name string
		dst  *time.Time
	}{{"from", &from}, {"to", &to}} {
		vals := q[p.name]
		if len(vals) == 0 {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, vals[0])
		if len(vals) > 1 || err != nil || t.Year() < 1 || t.Year() > 9999 {
			badRequest(w, "invalid-time-range", "Invalid time range",
				"from and to are optional RFC 3339 times, e.g. 2026-12-01T00:00:00Z, each given once.")
			return from, to, false
		}
		*p.dst = t
	}
	if !from.Before(to) {
		badRequest(w, "invalid-time-range", "Invalid time range", "from must be before to.")
		return from, to, false
	}
	return from, to, true
}

// handleExport streams the audit history as CSV (GET /api/audit/export),
// oldest first, until the rows end, the row cap or the time bound, and
// ends it with the mark line. Every export records itself as an audit
// event with its rows and, when partial, the bound that stopped it or, for
// one that failed (a 503 before any row, the database or the client lost
// mid-stream), the reason.
func (a *App) handleExport(w http.ResponseWriter, r *http.Request) {
	from, to, ok := timeRange(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	b, _ := heavy.FromContext(ctx)
	rc := http.NewResponseController(w)
	// A client that stops reading cannot hold the permit for ever: writes
	// fail a little after the time bound, the handler returns, and the
	// permit is released.
	_ = rc.SetWriteDeadline(b.Deadline.Add(10 * time.Second))
	cw := csv.NewWriter(w)
	started, lagging := false, false
	start := func() bool {
		if started {
			return true
		}
		started = true
		w.Header().Set("Content-Type", "text/csv; charset=utf-8")
		w.Header().Set("Content-Disposition", `attachment; filename="audit.csv"`)
		w.Header().Set("Cache-Control", "no-store")
		if lagging {
			w.Header().Set("X-May-Lag", "true")
		}
		w.WriteHeader(http.StatusOK)
		_ = cw.Write([]string{"id", "occurred_at", "actor", "action", "target"})
		return false
	}
	var mark heavy.Mark
	err := readroute.Read(ctx, func(pool *pgxpool.Pool, mayLag bool) error {
		lagging = mayLag
		return heavy.Read(ctx, pool, func(tx pgx.Tx) error {
			return a.streamExport(ctx, tx, from, to, b, &mark, cw, rc, start)
		})
	})
	if err != nil && !started && errors.Is(err, heavy.ErrTimedOut) {
		// The bound stopped the read before it had a row: a 503 and, in the
		// audit trail, an export stopped by its time bound with no rows.
		mark, err = heavy.Mark{Bound: heavy.BoundTime, Limit: formatBound(b.Time)}, nil
	}
	if err != nil && !started {
		a.heavyError(w, r, err)
		a.recordExport(ctx, from, to, mark, exportFailure(r, err))
		return
	}
	if mark.Bound == heavy.BoundTime && mark.Rows == 0 {
		heavy.WriteError(w, r, heavy.ErrTimedOut)
		a.recordExport(ctx, from, to, mark, "")
		return
	}
	if err != nil {
		// Rows went out already: the missing mark tells the client the
		// file is incomplete.
		var mid *midStreamError
		if errors.As(err, &mid) {
			err = mid.err
		}
		reason := exportFailure(r, err)
		if reason != reasonClientGone {
			a.log.WarnContext(ctx, "audit export failed mid-stream", "rows", mark.Rows, "reason", reason, "err", err)
		}
		cw.Flush()
		a.recordExport(ctx, from, to, mark, reason)
		return
	}
	start()
	cw.Flush()
	_, _ = w.Write([]byte(mark.String() + "\n"))
	a.recordExport(ctx, from, to, mark, "")
}

// Reasons an export failed, as its audit.export event names them.
const (
	reasonClientGone  = "client-gone"          // the client went away
	reasonWriteFailed = "write-failed"         // the client could not be written to (stopped reading)
	reasonUnavailable = "database-unavailable" // the database could not be reached or went away
	reasonError       = "error"                // anything else; the log has the error
)

// exportFailure names why the export r failed with err.
func exportFailure(r *http.Request, err error) string {
	var we *writeError
	c := classOf(r, err)
	switch {
	case c == pglimit.ClassCanceled:
		return reasonClientGone
	case errors.As(err, &we):
		return reasonWriteFailed
	case c == pglimit.ClassUnavailable || c == pglimit.ClassTimeout:
		return reasonUnavailable
	}
	return reasonError
}

// writeError is a failed write of the export to its client.
type writeError struct{ err error }

func (e *writeError) Error() string { return "writing the export: " + e.err.Error() }
func (e *writeError) Unwrap() error { return e.err }

// streamExport writes the rows of one export attempt to cw, starting the
// response at the first row (start reports whether it had started before).
func (a *App) streamExport(ctx context.Context, tx pgx.Tx, from, to time.Time, b heavy.Bounds, mark *heavy.Mark,
	cw *csv.Writer, rc *http.ResponseController, start func() bool) error {
	rows, err := tx.Query(ctx, studiodb.AuditEventExport, from, to, int32(b.Rows+1))
	if err != nil {
		return err
	}
	written := 0
	*mark, err = heavy.Stream(ctx, rows, func(rows pgx.Rows) error {
		var (
			id                    int64
			at                    time.Time
			actor, action, target string
		)
		if err := rows.Scan(&id, &at, &actor, &action, &target); err != nil {
			return err
		}
		start()
		if err := cw.Write([]string{strconv.FormatInt(id, 10), at.UTC().Format(time.RFC3339Nano), actor, action, target}); err != nil {
			return &writeError{err}
		}
		if written++; written%1000 == 0 {
			cw.Flush()
			_ = rc.Flush()
		}
		if err := cw.Error(); err != nil {
			return &writeError{err}
		}
		return nil
	})
	if err != nil && written > 0 {
		// Rows went out already: the read must not be run again on the
		// primary, so the failure is reported opaquely.
		return &midStreamError{err}
	}
	return err
}

// midStreamError is a read that failed after rows were written; it does
// not unwrap, so read routing never retries it.
type midStreamError struct{ err error }

func (e *midStreamError) Error() string { return "export failed after rows were written" }

// recordExport writes the audit.export event on the primary, after the
// bound: its context outlives the request's. The detail holds rows and
// partial; the bound and its limit when one stopped the export; the reason
// (reasonClientGone, ...) when it failed, which makes it partial.
func (a *App) recordExport(ctx context.Context, from, to time.Time, m heavy.Mark, failed string) {
	id, _ := IdentityFrom(ctx)
	detail := map[string]any{"rows": m.Rows, "partial": m.Partial() || failed != ""}
	if m.Partial() {
		detail["bound"] = m.Bound
		detail["limit"] = m.Limit
	}
	if failed != "" {
		detail["reason"] = failed
	}
	if !from.Equal(beginningOfTime) {
		detail["from"] = from
	}
	if !to.Equal(endOfTime) {
		detail["to"] = to
	}
	body, _ := json.Marshal(detail)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if err := a.q.AuditEventRecord(ctx, a.primary, &studiodb.AuditEventRecordParams{
		Actor: id.Username, Action: "audit.export", Target: "audit_event", Detail: body,
	}); err != nil {
		a.log.WarnContext(ctx, "audit.export event not recorded", "err", err)
	}
}

// formatBound writes a time bound as heavy's marks and problems do: whole
// seconds as "30s", anything finer as Go writes it ("1.5s", "250ms").
func formatBound(d time.Duration) string {
	if d%time.Second == 0 {
		return strconv.FormatInt(int64(d/time.Second), 10) + "s"
	}
	return d.String()
}
