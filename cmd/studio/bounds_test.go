package main_test

// Tests of the heavy endpoints' bounds (issue 11, sections 4 and 5): a
// bound that is reached stops the work in the database, at once, and the
// answer says which bound it was.

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/activity"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
)

// statementsLike counts the sessions of the observer's database whose
// current or last statement holds marker and that still run it or hold its
// transaction open (internal/harness/activity: an observer that cannot read every
// session's statement fails the test rather than count none).
func statementsLike(t *testing.T, obs activity.Querier, marker string) int {
	t.Helper()
	texts, err := activity.Holding(context.Background(), obs, marker)
	if err != nil {
		t.Fatalf("observer: %v", err)
	}
	return len(texts)
}

// TestConsoleCapsStopTheStatement runs console statements that would
// produce rows until the time bound (30 s): a cross join of the audit
// history, stopped by the row cap, and wide rows, stopped by the response
// size cap. Each answers 200 with bound ROWS well inside the time bound;
// right after the answer pg_stat_activity no longer shows the statement and
// no permit is held. Before the fix each took the whole 30 s, the database
// producing rows nobody read (pgx's Rows.Close reads a result to its end).
func TestConsoleCapsStopTheStatement(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-sql-console-time", "30s", "-sql-console-rows", "1000")
	obs := pgtest.Pool(t, dbURL, 1)
	limits := pgtest.Pool(t, dbURL, 1)
	for _, tc := range []struct {
		name, marker, sql string
		rows              func(int) bool
	}{
		{"row cap", "probe-row-cap", `SELECT a.id, b.id, 'probe-row-cap' FROM audit_event a CROSS JOIN audit_event b`,
			func(n int) bool { return n == 1000 }},
		{"size cap", "probe-size-cap", `SELECT repeat('x', 60000), 'probe-size-cap' FROM audit_event a CROSS JOIN audit_event b`,
			func(n int) bool { return n > 0 && n < 1000 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r := call(t, http.MethodPost, procs[0].URL+"/api/sql", "alice-token", console(tc.sql))
			took := time.Since(start)
			if r.Status != http.StatusOK {
				t.Fatalf("%d %s", r.Status, r.Body)
			}
			m := r.json(t)
			rows, _ := m["rows"].([]any)
			if m["bound"] != "ROWS" || !tc.rows(len(rows)) {
				t.Fatalf("bound %v with %d rows", m["bound"], len(rows))
			}
			// A behavioural bound, not a speed claim: the answer comes when
			// the cap is reached, not at the 30 s time bound (15 s tells the
			// two apart however loaded the machine).
			if took > 15*time.Second {
				t.Errorf("answered after %v; the time bound is 30s and the cap was reached at once", took)
			}
			gone := wait.For(t, 5*time.Second, "the statement gone from pg_stat_activity and the permits released", func() bool {
				return statementsLike(t, obs, tc.marker) == 0 &&
					count(limits, `SELECT count(*) FROM pglimit.heavy_permit`) == 0
			})
			t.Logf("answered in %v with %d rows; statement and permits gone %v after the answer", took.Round(time.Millisecond), len(rows), gone.Round(time.Millisecond))
		})
	}
}

// TestHistoryAndFlowRowCaps: the history endpoints and the flow graph have
// a row cap of their own (-history-rows, -flow-rows) and say when it was
// reached. History: page numbers reach the cap and no further, the total
// counts to the cap and then says bound ROWS; a page under the cap, or a
// keyset page (no total), says bound null. Flow: the busiest -flow-rows
// address pairs, as the database sums them, with bound ROWS; a range with
// fewer pairs is whole (bound null).
func TestHistoryAndFlowRowCaps(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-history-rows", "500", "-flow-rows", "5")
	base := procs[0].URL
	db := pgtest.Pool(t, dbURL, 1)

	type page struct {
		Items       []map[string]any `json:"items"`
		Total       *int64           `json:"total"`
		TotalCapped bool             `json:"totalCapped"`
		Next        *string          `json:"next"`
		Bound       *string          `json:"bound"`
	}
	get := func(path string) (page, *response) {
		r := call(t, http.MethodGet, base+path, "alice-token", nil)
		var p page
		if r.Status == http.StatusOK {
			if err := jsonUnmarshal(r.Body, &p); err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(string(r.Body), `"bound":`) {
				t.Errorf("%s: no bound member: %s", path, r.Body)
			}
		}
		return p, r
	}
	for _, endpoint := range []string{"/api/audit", "/api/events", "/api/alerts"} {
		p, r := get(endpoint + "?page=1&size=50")
		if r.Status != http.StatusOK || p.Total == nil || *p.Total != 500 || !p.TotalCapped || p.Bound == nil || *p.Bound != "ROWS" {
			t.Errorf("%s first page: %d total %v capped %v bound %v", endpoint, r.Status, p.Total, p.TotalCapped, p.Bound)
		}
		if _, r := get(endpoint + "?page=2&size=200"); r.Status != http.StatusOK {
			t.Errorf("%s rows 201-400, under the cap of 500: %d %s", endpoint, r.Status, r.Body)
		}
		_, r = get(endpoint + "?page=3&size=200")
		r.problemOf(t, http.StatusBadRequest, "page-too-deep")
		if p.Next == nil {
			t.Fatalf("%s: no next cursor", endpoint)
		}
		k, r := get(endpoint + "?size=50&after=" + *p.Next)
		if r.Status != http.StatusOK || len(k.Items) != 50 || k.Total != nil || k.Bound != nil {
			t.Errorf("%s keyset page: %d, %d items, total %v, bound %v", endpoint, r.Status, len(k.Items), k.Total, k.Bound)
		}
	}
	// A range holding fewer rows than the cap is counted whole.
	var from time.Time
	if err := db.QueryRow(context.Background(), `SELECT occurred_at FROM audit_event ORDER BY occurred_at DESC, id DESC OFFSET 99 LIMIT 1`).Scan(&from); err != nil {
		t.Fatal(err)
	}
	var want int64
	if err := db.QueryRow(context.Background(), `SELECT count(*) FROM audit_event WHERE occurred_at >= $1`, from).Scan(&want); err != nil {
		t.Fatal(err)
	}
	p, r := get("/api/audit?page=1&size=10&from=" + from.UTC().Format(time.RFC3339Nano))
	if r.Status != http.StatusOK || p.Total == nil || *p.Total != want || p.TotalCapped || p.Bound != nil {
		t.Errorf("a range of %d rows: %d total %v capped %v bound %v", want, r.Status, p.Total, p.TotalCapped, p.Bound)
	}

	type graph struct {
		Nodes []string `json:"nodes"`
		Edges []struct {
			Source   string `json:"source"`
			Target   string `json:"target"`
			Messages int64  `json:"messages"`
		} `json:"edges"`
		Bound *string `json:"bound"`
	}
	flow := func(query string) graph {
		r := call(t, http.MethodGet, base+"/api/flow"+query, "alice-token", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("flow%s: %d %s", query, r.Status, r.Body)
		}
		var g graph
		if err := jsonUnmarshal(r.Body, &g); err != nil {
			t.Fatal(err)
		}
		return g
	}
	g := flow("")
	var pairs int
	if err := db.QueryRow(context.Background(), `SELECT count(DISTINCT (source_address, target_address)) FROM message_flow`).Scan(&pairs); err != nil {
		t.Fatal(err)
	}
	if pairs <= 5 {
		t.Fatalf("the demo data has %d address pairs; the test needs more than the cap of 5", pairs)
	}
	rows, err := db.Query(context.Background(), `SELECT sum(messages)::bigint FROM message_flow
		GROUP BY source_address, target_address ORDER BY 1 DESC LIMIT 5`)
	if err != nil {
		t.Fatal(err)
	}
	busiest, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range g.Edges {
		got = append(got, e.Messages)
	}
	if g.Bound == nil || *g.Bound != "ROWS" || !slices.Equal(got, busiest) {
		t.Errorf("flow graph cut at 5 of %d pairs: bound %v, edges' messages %v, want the busiest %v", pairs, g.Bound, got, busiest)
	}
	// Three minutes of flow: three pairs, under the cap.
	small := flow("?from=" + time.Now().Add(-3*time.Minute-30*time.Second).UTC().Format(time.RFC3339))
	if small.Bound != nil || len(small.Edges) == 0 || len(small.Edges) > 5 {
		t.Errorf("a small flow graph: bound %v, %d edges", small.Bound, len(small.Edges))
	}
}
