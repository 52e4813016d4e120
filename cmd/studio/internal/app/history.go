package app

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// historyPage is the answer of GET /api/audit, /api/events and
// /api/alerts: items newest first; total (page mode only; totalCapped when
// there are more rows than page numbers reach); next, the cursor to pass as
// after (null on the last page); mayLag when the read replica served it;
// bound, as the console's, "ROWS" when the row cap (-history-rows) stopped
// the total, else null (a read stopped by its time bound has no page: 503).
type historyPage[T any] struct {
	Items       []T     `json:"items"`
	Total       *int64  `json:"total,omitempty"`
	TotalCapped bool    `json:"totalCapped,omitempty"`
	Next        *string `json:"next"`
	MayLag      bool    `json:"mayLag"`
	Bound       *string `json:"bound"`
}

// maxPageSize is the largest page a history request may ask for; the
// history row cap (-history-rows) is at least this.
const maxPageSize = 200

// history reads one history table. page reads page mode (LIMIT, OFFSET),
// after reads cursor mode, count is the capped count.
type history[T any] struct {
	name  string
	page  func(ctx context.Context, tx pgx.Tx, since, until time.Time, size, skip int32) ([]T, error)
	after func(ctx context.Context, tx pgx.Tx, since, until time.Time, at time.Time, id int64, size int32) ([]T, error)
	count func(ctx context.Context, tx pgx.Tx, since, until time.Time, limit int32) (int32, error)
	pos   func(T) cursor.Position
}

// historyQuery is a validated history request.
type historyQuery struct {
	from, to time.Time
	binding  string
	page     cursor.Page
}

// parseHistory validates the filters and the paging of r; a refusal is
// written and ok is false.
func (a *App) parseHistory(w http.ResponseWriter, r *http.Request, endpoint string) (historyQuery, bool) {
	from, to, ok := timeRange(w, r)
	if !ok {
		return historyQuery{}, false
	}
	filters := url.Values{}
	if !from.Equal(beginningOfTime) {
		filters.Set("from", from.UTC().Format(time.RFC3339Nano))
	}
	if !to.Equal(endOfTime) {
		filters.Set("to", to.UTC().Format(time.RFC3339Nano))
	}
	binding := cursor.Binding(endpoint, filters)
	page, err := a.pager.Parse(r.URL.Query(), binding)
	if err != nil {
		cursor.WriteError(w, r, err)
		return historyQuery{}, false
	}
	return historyQuery{from: from, to: to, binding: binding, page: page}, true
}

func (h history[T]) handler(a *App) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		q, ok := a.parseHistory(w, r, h.name)
		if !ok {
			return
		}
		resp, err := h.read(r.Context(), a, q)
		if err != nil {
			a.heavyError(w, r, err)
			return
		}
		writeJSON(w, http.StatusOK, resp)
	}
}

// read runs the page's statements in one bounded, read-only transaction on
// the pool read routing chose. The row cap bounds both: page numbers reach
// no further than it (the pager refuses a deeper page), and the total
// counts at most one row past it.
func (h history[T]) read(ctx context.Context, a *App, q historyQuery) (historyPage[T], error) {
	var (
		items []T
		total int32
	)
	lag, err := a.readBounded(ctx, func(tx pgx.Tx) error {
		var err error
		if q.page.After != nil {
			items, err = h.after(ctx, tx, q.from, q.to, q.page.After.At, q.page.After.ID, int32(q.page.Size))
			return err
		}
		if items, err = h.page(ctx, tx, q.from, q.to, int32(q.page.Size), int32(q.page.Offset())); err != nil {
			return err
		}
		total, err = h.count(ctx, tx, q.from, q.to, int32(a.pager.CountLimit()))
		return err
	})
	if err != nil {
		return historyPage[T]{}, err
	}
	resp := historyPage[T]{Items: items, MayLag: lag}
	if resp.Items == nil {
		resp.Items = []T{}
	}
	if q.page.After == nil {
		t, capped := a.pager.Total(int64(total))
		resp.Total, resp.TotalCapped = &t, capped
		if capped {
			bound := heavy.BoundRows
			resp.Bound = &bound
		}
	}
	if len(items) > 0 {
		if next := a.pager.Next(q.binding, q.page, len(items), h.pos(items[len(items)-1])); next != "" {
			resp.Next = &next
		}
	}
	return resp, nil
}

// The three histories of REFERENCE-SERVICE.md.

type auditItem struct {
	ID         int64          `json:"id"`
	OccurredAt time.Time      `json:"occurredAt"`
	Actor      string         `json:"actor"`
	Action     string         `json:"action"`
	Target     string         `json:"target"`
	Detail     rawJSONOrEmpty `json:"detail"`
}

type eventItem struct {
	ID         int64     `json:"id"`
	OccurredAt time.Time `json:"occurredAt"`
	Source     string    `json:"source"`
	Kind       string    `json:"kind"`
	Message    string    `json:"message"`
}

type alertItem struct {
	ID         int64     `json:"id"`
	OccurredAt time.Time `json:"occurredAt"`
	Severity   string    `json:"severity"`
	Name       string    `json:"name"`
	Message    string    `json:"message"`
}

// rawJSONOrEmpty writes a jsonb value as it is.
type rawJSONOrEmpty []byte

func (j rawJSONOrEmpty) MarshalJSON() ([]byte, error) {
	if len(j) == 0 {
		return []byte("{}"), nil
	}
	return j, nil
}

func (a *App) auditHistory() history[auditItem] {
	conv := func(id int64, at time.Time, actor, action, target string, detail []byte) auditItem {
		return auditItem{id, at, actor, action, target, detail}
	}
	return history[auditItem]{
		name: "audit-history",
		page: func(ctx context.Context, tx pgx.Tx, since, until time.Time, size, skip int32) ([]auditItem, error) {
			rows, err := a.q.AuditEventPage(ctx, tx, &studiodb.AuditEventPageParams{Since: since, Until: until, Size: size, Skip: skip})
			out := make([]auditItem, len(rows))
			for i, r := range rows {
				out[i] = conv(r.ID, r.OccurredAt, r.Actor, r.Action, r.Target, r.Detail)
			}
			return out, err
		},
		after: func(ctx context.Context, tx pgx.Tx, since, until, at time.Time, id int64, size int32) ([]auditItem, error) {
			rows, err := a.q.AuditEventPageAfter(ctx, tx, &studiodb.AuditEventPageAfterParams{At: at, ID: id, Since: since, Until: until, Size: size})
			out := make([]auditItem, len(rows))
			for i, r := range rows {
				out[i] = conv(r.ID, r.OccurredAt, r.Actor, r.Action, r.Target, r.Detail)
			}
			return out, err
		},
		count: func(ctx context.Context, tx pgx.Tx, since, until time.Time, limit int32) (int32, error) {
			return a.q.AuditEventCount(ctx, tx, &studiodb.AuditEventCountParams{Since: since, Until: until, Cap: limit})
		},
		pos: func(it auditItem) cursor.Position { return cursor.Position{At: it.OccurredAt, ID: it.ID} },
	}
}

func (a *App) eventHistory() history[eventItem] {
	return history[eventItem]{
		name: "event-history",
		page: func(ctx context.Context, tx pgx.Tx, since, until time.Time, size, skip int32) ([]eventItem, error) {
			rows, err := a.q.EventPage(ctx, tx, &studiodb.EventPageParams{Since: since, Until: until, Size: size, Skip: skip})
			out := make([]eventItem, len(rows))
			for i, r := range rows {
				out[i] = eventItem(*r)
			}
			return out, err
		},
		after: func(ctx context.Context, tx pgx.Tx, since, until, at time.Time, id int64, size int32) ([]eventItem, error) {
			rows, err := a.q.EventPageAfter(ctx, tx, &studiodb.EventPageAfterParams{At: at, ID: id, Since: since, Until: until, Size: size})
			out := make([]eventItem, len(rows))
			for i, r := range rows {
				out[i] = eventItem(*r)
			}
			return out, err
		},
		count: func(ctx context.Context, tx pgx.Tx, since, until time.Time, limit int32) (int32, error) {
			return a.q.EventCount(ctx, tx, &studiodb.EventCountParams{Since: since, Until: until, Cap: limit})
		},
		pos: func(it eventItem) cursor.Position { return cursor.Position{At: it.OccurredAt, ID: it.ID} },
	}
}

func (a *App) alertHistory() history[alertItem] {
	return history[alertItem]{
		name: "alert-history",
		page: func(ctx context.Context, tx pgx.Tx, since, until time.Time, size, skip int32) ([]alertItem, error) {
			rows, err := a.q.AlertPage(ctx, tx, &studiodb.AlertPageParams{Since: since, Until: until, Size: size, Skip: skip})
			out := make([]alertItem, len(rows))
			for i, r := range rows {
				out[i] = alertItem(*r)
			}
			return out, err
		},
		after: func(ctx context.Context, tx pgx.Tx, since, until, at time.Time, id int64, size int32) ([]alertItem, error) {
			rows, err := a.q.AlertPageAfter(ctx, tx, &studiodb.AlertPageAfterParams{At: at, ID: id, Since: since, Until: until, Size: size})
			out := make([]alertItem, len(rows))
			for i, r := range rows {
				out[i] = alertItem(*r)
			}
			return out, err
		},
		count: func(ctx context.Context, tx pgx.Tx, since, until time.Time, limit int32) (int32, error) {
			return a.q.AlertCount(ctx, tx, &studiodb.AlertCountParams{Since: since, Until: until, Cap: limit})
		},
		pos: func(it alertItem) cursor.Position { return cursor.Position{At: it.OccurredAt, ID: it.ID} },
	}
}
