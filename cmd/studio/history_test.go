package main_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
)

type historyResp struct {
	Items []struct {
		ID         int64  `json:"id"`
		OccurredAt string `json:"occurredAt"`
	} `json:"items"`
	Total       *int64  `json:"total"`
	TotalCapped bool    `json:"totalCapped"`
	Next        *string `json:"next"`
	MayLag      bool    `json:"mayLag"`
}

func getHistory(t *testing.T, u string) historyResp {
	t.Helper()
	r := call(t, http.MethodGet, u, "alice-token", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("GET %s: %d %s", u, r.Status, r.Body)
	}
	var h historyResp
	if err := jsonUnmarshal(r.Body, &h); err != nil {
		t.Fatal(err)
	}
	return h
}

// TestHistoryPagesEveryRowOnce pages through 25,000 audit events (three to
// a second, so the sort key has ties) by page number to row 10,000, then by
// cursor, alternating replicas, and checks that every row comes exactly
// once, in the order the database gives.
func TestHistoryPagesEveryRowOnce(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 3)
	conn, err := pgx.Connect(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var want []int64
	rows, _ := conn.Query(context.Background(), `SELECT id FROM audit_event ORDER BY occurred_at DESC, id DESC LIMIT 25000`)
	want, err = pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}

	var got []int64
	var next string
	for page := 1; page <= 50; page++ {
		h := getHistory(t, fmt.Sprintf("%s/api/audit?page=%d&size=200", procs[page%3].URL, page))
		if h.Total == nil || *h.Total != 10000 || !h.TotalCapped {
			t.Fatalf("page %d: total %v capped %v, want 10000 and capped", page, h.Total, h.TotalCapped)
		}
		if h.Next == nil {
			t.Fatalf("page %d: no next cursor", page)
		}
		for _, it := range h.Items {
			got = append(got, it.ID)
		}
		next = *h.Next
	}
	for i := 0; len(got) < 25000; i++ {
		h := getHistory(t, fmt.Sprintf("%s/api/audit?size=200&after=%s", procs[i%3].URL, url.QueryEscape(next)))
		if h.Total != nil {
			t.Fatal("cursor mode returned a total")
		}
		for _, it := range h.Items {
			got = append(got, it.ID)
		}
		next = *h.Next
	}
	if len(got) != len(want) {
		t.Fatalf("read %d rows, want %d", len(got), len(want))
	}
	seen := map[int64]bool{}
	for i := range want {
		if seen[got[i]] {
			t.Fatalf("row %d (id %d) read twice", i, got[i])
		}
		seen[got[i]] = true
		if got[i] != want[i] {
			t.Fatalf("row %d: id %d, want %d", i, got[i], want[i])
		}
	}
}

// TestHistoryRefusals: a page past row 10,000, bad paging parameters, a
// cursor from another endpoint, and every single-character edit of a
// cursor are all refused with the contract's problem.
func TestHistoryRefusals(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1)
	base := procs[0].URL

	r := call(t, http.MethodGet, base+"/api/audit?page=201&size=50", "alice-token", nil)
	m := r.problemOf(t, http.StatusBadRequest, "page-too-deep")
	if d := as[string](t, m["detail"], "detail"); !strings.Contains(d, "next") || !strings.Contains(d, "after") {
		t.Fatalf("page-too-deep detail does not name the next cursor and the after parameter: %q", d)
	}
	if r := call(t, http.MethodGet, base+"/api/audit?page=200&size=50", "alice-token", nil); r.Status != http.StatusOK {
		t.Fatalf("page 200 of 50 (rows to 10,000): %d", r.Status)
	}

	for _, q := range []string{"page=0", "page=-1", "page=abc", "size=0", "size=201", "size=-5", "size=1e3",
		"page=1&page=2", "page=99999999999999999999", "page=1&after=x", "size=%205", "size=5%00"} {
		r := call(t, http.MethodGet, base+"/api/audit?"+q, "alice-token", nil)
		r.problemOf(t, http.StatusBadRequest, "invalid-page")
	}

	ev := getHistory(t, base+"/api/events?size=5")
	r = call(t, http.MethodGet, base+"/api/audit?after="+url.QueryEscape(*ev.Next), "alice-token", nil)
	r.problemOf(t, http.StatusBadRequest, "invalid-cursor")

	au := getHistory(t, base+"/api/audit?size=5")
	c := *au.Next
	alphabet := "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := 0; i < len(c); i++ {
		repl := alphabet[(strings.IndexByte(alphabet, c[i])+1)%len(alphabet)]
		tampered := c[:i] + string(repl) + c[i+1:]
		r := call(t, http.MethodGet, base+"/api/audit?after="+url.QueryEscape(tampered), "alice-token", nil)
		r.problemOf(t, http.StatusBadRequest, "invalid-cursor")
	}
	for _, bad := range []string{c[:len(c)-1], c + "A", "", strings.Repeat("A", 5000), "!!!!", c + "=="} {
		r := call(t, http.MethodGet, base+"/api/audit?after="+url.QueryEscape(bad), "alice-token", nil)
		if r.Status != http.StatusBadRequest {
			t.Errorf("cursor %.40q: %d", bad, r.Status)
		}
	}
	// A cursor made for another time range is refused too.
	r = call(t, http.MethodGet, base+"/api/audit?from=2020-01-01T00:00:00Z&after="+url.QueryEscape(c), "alice-token", nil)
	r.problemOf(t, http.StatusBadRequest, "invalid-cursor")
}
