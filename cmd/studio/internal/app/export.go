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
	mquota "github.com/pglimit/pglimit/middleware/quota"
	"github.com/pglimit/pglimit/middleware/readroute"
	"github.com/pglimit/pglimit/quota"
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
	// The day's export rows (-export-rows-per-day): reserve what the export
	// may send before it starts, and settle by what it sent when it ends.
	reserved, ok := a.reserveExportRows(w, r, b)
	if !ok {
		return
	}
	if reserved != nil && reserved.Refusal == nil && !a.cfg.DryRun[policyExportRows] && (b.Rows == 0 || reserved.Cost < int64(b.Rows)) {
		// The export stops where the reservation ends: its mark then says
		// bound=ROWS with the rows the quota had left.
		b.Rows = int(reserved.Cost)
		var cancel context.CancelFunc
		ctx, cancel = heavy.NewContext(ctx, b)
		defer cancel()
	}
	var mark heavy.Mark
	defer func() { a.settleExportRows(r, reserved, mark.Rows) }()
	// A client that stops reading cannot hold the permit for ever: every
	// write of the stream has a deadline of its own (withWriteDeadline), so
	// one that takes no bytes for writeStall fails, the handler returns,
	// and the permit is released; a client that keeps reading keeps the
	// export going up to its time bound.
	rc := http.NewResponseController(w)
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
	_, err := readroute.Read(ctx, func(pool *pgxpool.Pool, mayLag bool) error {
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

// reserveExportRows reserves, in the user's day of export rows, what the
// export may send: min(what is left today, the export's row cap), read by
// a peek and charged at once; when another replica spent some in between
// the charge is refused and tried again with what its refusal says is
// left. With nothing left it answers 429 quota-exhausted (or 503) and ok
// is false. Without the quota it reserves nothing (nil). The reservation
// is exact: an export never sends more than it reserved, so the day's
// total never passes the quota. In dry run (-dry-run export-rows) the
// export reserves its whole row cap: it is charged when that fits, counted
// and logged as dry-run-refused (and charged nothing) when it does not,
// and never stopped short by the quota.
func (a *App) reserveExportRows(w http.ResponseWriter, r *http.Request, b heavy.Bounds) (*quota.Permit, bool) {
	l := a.quotas.exportRows
	if l == nil {
		return nil, true
	}
	id, _ := IdentityFrom(r.Context())
	key := quotaKey(id.Username)
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	if a.cfg.DryRun[policyExportRows] {
		p, err := l.AcquireN(ctx, key, int64(max(b.Rows, 1))) // a cap of 0 (none): one row stands for it
		if err != nil {
			a.quotaError(w, r, err)
			return nil, false
		}
		mquota.SetHeaders(w.Header(), policyExportRows, p.State)
		return p, true
	}
	st, err := l.Peek(ctx, key)
	if err != nil {
		a.quotaError(w, r, err)
		return nil, false
	}
	left := st.Remaining
	for try := 0; ; try++ {
		want := max(left, 1) // nothing left: a charge of 1, refused with the quota's state
		if b.Rows > 0 {
			want = min(want, int64(b.Rows))
		}
		p, err := l.AcquireN(ctx, key, want)
		var le *quota.LimitError
		if errors.As(err, &le) && le.State.Remaining > 0 && try < 3 {
			left = le.State.Remaining
			continue
		}
		if err != nil {
			a.quotaError(w, r, err)
			return nil, false
		}
		mquota.SetHeaders(w.Header(), policyExportRows, p.State)
		return p, true
	}
}

// settleExportRows settles the export's reservation by the rows it sent
// (a failed or stopped export: what it sent before it stopped), after the
// request's context: the rows went out.
func (a *App) settleExportRows(r *http.Request, p *quota.Permit, rows int) {
	if p == nil || p.Refusal != nil {
		return
	}
	if err := p.Settle(r.Context(), int64(rows)); err != nil {
		a.log.WarnContext(r.Context(), "export rows not settled", "rows", rows, "reserved", p.Cost, "err", err)
	}
}

// Reasons an export failed, as its audit.export event names them.
const (
	reasonClientGone  = "client-gone"          // the client went away
	reasonWriteFailed = "write-failed"         // the client could not be written to (stopped reading)
	reasonUnavailable = "database-unavailable" // the database could not be reached or went away
	reasonError       = "error"                // anything else; the log has the error
)

// exportFailure names why the export (or the reset) r failed with err, as
// its audit event says.
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
	detail := map[string]any{"rows": m.Rows, "partial": m.Bound != "" || failed != ""}
	if m.Bound != "" {
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
