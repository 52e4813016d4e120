package cursor_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"time"

	"github.com/pglimit/pglimit/cursor"
)

// A history handler parses the paging parameters, runs the page query of
// its mode, and answers with a next cursor; a page number too deep is
// refused with a body that names the cursor.
func Example() {
	// One key for every replica, from configuration (here a fixed one).
	codec, _ := cursor.NewCodec([]byte("a key of at least sixteen bytes!"))
	pager, _ := cursor.NewPager(codec, cursor.Rules{}) // size ≤ 200, default 50, pages reach 10,000 rows
	binding := cursor.Binding("event-history", url.Values{"type": {"alert"}})

	// Page mode: ?page=3&size=20.
	page, _ := pager.Parse(url.Values{"page": {"3"}, "size": {"20"}}, binding)
	fmt.Println("keyset:", page.After != nil, "LIMIT", page.Size, "OFFSET", page.Offset())
	// ... SELECT ... ORDER BY occurred_at DESC, id DESC LIMIT 20 OFFSET 40,
	// which returned a full page whose last row is:
	last := cursor.Position{At: time.Date(2026, 10, 13, 9, 30, 0, 123456000, time.UTC), ID: 4711}
	next := pager.Next(binding, page, 20, last)

	// Cursor mode: ?after=<next>&size=20.
	page, _ = pager.Parse(url.Values{"after": {next}, "size": {"20"}}, binding)
	fmt.Println("keyset:", page.After != nil, "after", page.After.At.Format(time.RFC3339Nano), page.After.ID)
	// ... WHERE (occurred_at, id) < ($at, $id) ORDER BY occurred_at DESC, id DESC LIMIT 20

	// The same cursor on another endpoint is refused.
	_, err := pager.Parse(url.Values{"after": {next}}, cursor.Binding("audit-history", nil))
	fmt.Println(err != nil)

	// The total of page mode: a count capped at 10,001 rows.
	total, capped := pager.Total(10001)
	fmt.Println("total", total, "totalCapped", capped)

	// Page 201 of 50 reaches past row 10,000.
	r := httptest.NewRequest(http.MethodGet, "/api/events?page=201", nil)
	_, err = pager.Parse(r.URL.Query(), binding)
	w := httptest.NewRecorder()
	cursor.WriteError(w, r, err)
	fmt.Print(w.Code, " ", w.Body.String())
	// Output:
	// keyset: false LIMIT 20 OFFSET 40
	// keyset: true after 2026-10-13T09:30:00.123456Z 4711
	// true
	// total 10000 totalCapped true
	// 400 {"type":"urn:pglimit:problem:page-too-deep","title":"Page too deep","status":400,"detail":"Page numbers reach the first 10,000 rows. To read further, pass the `next` cursor of the last page as the `after` parameter (or narrow the query, e.g. a shorter time range).","instance":"/api/events","limit":10000,"parameter":"after"}
}
