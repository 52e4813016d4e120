package cursor_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/cursor"
)

const binding = "event-history"

func mustPager(t testing.TB, rules cursor.Rules) *cursor.Pager {
	t.Helper()
	p, err := cursor.NewPager(mustCodec(t, testKey), rules)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestParse(t *testing.T) {
	t.Parallel()
	p := mustPager(t, cursor.Rules{})
	pos := cursor.Position{At: time.Date(2026, 10, 13, 9, 30, 0, 500000000, time.UTC), ID: 99}
	valid := p.Encode(binding, pos)
	foreign := p.Encode("audit-history", pos)

	ok := []struct {
		query string
		want  cursor.Page
	}{
		{"", cursor.Page{Number: 1, Size: 50}},
		{"type=alert&from=x", cursor.Page{Number: 1, Size: 50}}, // filters are not paging
		{"page=1", cursor.Page{Number: 1, Size: 50}},
		{"page=2&size=10", cursor.Page{Number: 2, Size: 10}},
		{"size=1", cursor.Page{Number: 1, Size: 1}},
		{"size=200", cursor.Page{Number: 1, Size: 200}},
		{"page=200&size=50", cursor.Page{Number: 200, Size: 50}}, // rows 9,951..10,000
		{"page=50&size=200", cursor.Page{Number: 50, Size: 200}}, // rows 9,801..10,000
		{"page=10000&size=1", cursor.Page{Number: 10000, Size: 1}},
		{"page=007", cursor.Page{Number: 7, Size: 50}},
		{"after=" + valid, cursor.Page{Size: 50, After: &pos}},
		{"after=" + valid + "&size=200", cursor.Page{Size: 200, After: &pos}},
	}
	for _, tc := range ok {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Parse(q, binding)
		if err != nil {
			t.Errorf("Parse(%q): %v", tc.query, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("Parse(%q) (-want +got):\n%s", tc.query, diff)
		}
	}

	bad := []struct {
		query string
		kind  error
		param string
	}{
		{"page=0", cursor.ErrInvalidPage, "page"},
		{"page=-1", cursor.ErrInvalidPage, "page"},
		{"page=+1", cursor.ErrInvalidPage, "page"},
		{"page=", cursor.ErrInvalidPage, "page"},
		{"page=1.0", cursor.ErrInvalidPage, "page"},
		{"page=1e3", cursor.ErrInvalidPage, "page"},
		{"page=0x10", cursor.ErrInvalidPage, "page"},
		{"page=%201", cursor.ErrInvalidPage, "page"},
		{"page=1%20", cursor.ErrInvalidPage, "page"},
		{"page=one", cursor.ErrInvalidPage, "page"},
		{"page=%EF%BC%91", cursor.ErrInvalidPage, "page"}, // fullwidth digit one
		{"page=1234567890", cursor.ErrInvalidPage, "page"},
		{"page=99999999999999999999999999", cursor.ErrInvalidPage, "page"},
		{"page=1&page=2", cursor.ErrInvalidPage, "page"},
		{"page=1&page=1", cursor.ErrInvalidPage, "page"},
		{"size=0", cursor.ErrInvalidPage, "size"},
		{"size=-5", cursor.ErrInvalidPage, "size"},
		{"size=201", cursor.ErrInvalidPage, "size"},
		{"size=100000", cursor.ErrInvalidPage, "size"},
		{"size=99999999999999999999", cursor.ErrInvalidPage, "size"},
		{"size=", cursor.ErrInvalidPage, "size"},
		{"size=ten", cursor.ErrInvalidPage, "size"},
		{"size=10&size=10", cursor.ErrInvalidPage, "size"},
		{"page=2&size=0", cursor.ErrInvalidPage, "size"},
		{"page=1&after=" + valid, cursor.ErrInvalidPage, "after"},
		{"page=x&after=" + valid, cursor.ErrInvalidPage, "after"},
		{"after=" + valid + "&after=" + valid, cursor.ErrInvalidPage, "after"},
		{"after=" + valid + "&size=0", cursor.ErrInvalidPage, "size"},
		{"page=201", cursor.ErrPageTooDeep, "page"},
		{"page=201&size=50", cursor.ErrPageTooDeep, "page"},
		{"page=51&size=200", cursor.ErrPageTooDeep, "page"},
		{"page=10001&size=1", cursor.ErrPageTooDeep, "page"},
		{"page=999999999&size=200", cursor.ErrPageTooDeep, "page"},
		{"after=", cursor.ErrInvalidCursor, "after"},
		{"after=" + foreign, cursor.ErrInvalidCursor, "after"},
		{"after=" + valid[:43], cursor.ErrInvalidCursor, "after"},
		{"after=" + valid + "A", cursor.ErrInvalidCursor, "after"},
		{"after=" + strings.Repeat("A", 100000), cursor.ErrInvalidCursor, "after"},
		{"after=12345", cursor.ErrInvalidCursor, "after"},
		{"after=" + url.QueryEscape(valid[:10]+"+"+valid[11:]), cursor.ErrInvalidCursor, "after"},
	}
	for _, tc := range bad {
		q, err := url.ParseQuery(tc.query)
		if err != nil {
			t.Fatal(err)
		}
		got, err := p.Parse(q, binding)
		if !errors.Is(err, tc.kind) {
			t.Errorf("Parse(%.60q) = %+v, %v; want %v", tc.query, got, err, tc.kind)
			continue
		}
		var e *cursor.Error
		if !errors.As(err, &e) || e.Param() != tc.param {
			t.Errorf("Parse(%.60q): error %#v, want Param %q", tc.query, err, tc.param)
		}
	}
}

func TestRulesAreConfigurable(t *testing.T) {
	t.Parallel()
	p := mustPager(t, cursor.Rules{MaxSize: 10, DefaultSize: 5, Limit: 100})
	parse := func(query string) (cursor.Page, error) {
		q, _ := url.ParseQuery(query)
		return p.Parse(q, binding)
	}
	if got, err := parse(""); err != nil || got.Size != 5 {
		t.Errorf("default size: %+v, %v", got, err)
	}
	if _, err := parse("size=11"); !errors.Is(err, cursor.ErrInvalidPage) {
		t.Errorf("size above MaxSize: %v", err)
	}
	if _, err := parse("page=10&size=10"); err != nil {
		t.Errorf("last reachable page: %v", err)
	}
	_, err := parse("page=11&size=10")
	var e *cursor.Error
	if !errors.As(err, &e) || e.Kind() != cursor.ErrPageTooDeep || e.Limit() != 100 {
		t.Errorf("page past Limit: %#v", err)
	}
	if !strings.Contains(e.Detail(), "first 100 rows") {
		t.Errorf("detail does not name the limit: %q", e.Detail())
	}
	if got := p.CountLimit(); got != 101 {
		t.Errorf("CountLimit = %d", got)
	}

	d := mustPager(t, cursor.Rules{})
	if diff := cmp.Diff(cursor.Rules{MaxSize: 200, DefaultSize: 50, Limit: 10000}, d.Rules()); diff != "" {
		t.Errorf("default rules (-want +got):\n%s", diff)
	}
	// A MaxSize below the default size takes it as the default size.
	if got := mustPager(t, cursor.Rules{MaxSize: 20}).Rules(); got.DefaultSize != 20 {
		t.Errorf("DefaultSize with MaxSize 20 = %d", got.DefaultSize)
	}
	for _, r := range []cursor.Rules{
		{MaxSize: -1}, {DefaultSize: -1}, {Limit: -1},
		{MaxSize: 10, DefaultSize: 11},
		{MaxSize: 200, Limit: 100},
		{MaxSize: 1_000_000_000},
	} {
		if _, err := cursor.NewPager(nil, r); err == nil {
			t.Errorf("NewPager accepted %+v", r)
		}
	}
}

func TestOffsetNextTotal(t *testing.T) {
	t.Parallel()
	p := mustPager(t, cursor.Rules{})
	last := cursor.Position{At: time.Date(2026, 3, 1, 0, 0, 0, 1000, time.UTC), ID: -3}
	for _, tc := range []struct {
		page   cursor.Page
		rows   int
		offset int
		next   bool
	}{
		{cursor.Page{Number: 1, Size: 50}, 50, 0, true},
		{cursor.Page{Number: 1, Size: 50}, 49, 0, false},
		{cursor.Page{Number: 1, Size: 50}, 0, 0, false},
		{cursor.Page{Number: 3, Size: 20}, 20, 40, true},
		{cursor.Page{Number: 200, Size: 50}, 50, 9950, true}, // the way past row 10,000
		{cursor.Page{Size: 50, After: &last}, 50, 0, true},
		{cursor.Page{Size: 50, After: &last}, 7, 0, false},
	} {
		if got := tc.page.Offset(); got != tc.offset {
			t.Errorf("%+v: Offset = %d, want %d", tc.page, got, tc.offset)
		}
		next := p.Next(binding, tc.page, tc.rows, last)
		if (next != "") != tc.next {
			t.Errorf("%+v with %d rows: next = %q, want one: %v", tc.page, tc.rows, next, tc.next)
			continue
		}
		if next == "" {
			continue
		}
		q := url.Values{"after": {next}, "size": {"50"}}
		got, err := p.Parse(q, binding)
		if err != nil || got.After == nil || got.After.ID != last.ID || !got.After.At.Equal(last.At) {
			t.Errorf("next cursor parses to %+v, %v", got, err)
		}
	}
	for _, tc := range []struct {
		count  int64
		total  int64
		capped bool
	}{{0, 0, false}, {1, 1, false}, {9999, 9999, false}, {10000, 10000, false}, {10001, 10000, true}} {
		total, capped := p.Total(tc.count)
		if total != tc.total || capped != tc.capped {
			t.Errorf("Total(%d) = %d, %v; want %d, %v", tc.count, total, capped, tc.total, tc.capped)
		}
	}
}

// WriteError writes the documented body for each refusal.
func TestProblemBodies(t *testing.T) {
	t.Parallel()
	p := mustPager(t, cursor.Rules{})
	for _, tc := range []struct {
		query  string
		slug   string
		detail []string
		ext    map[string]any
	}{
		{"page=201&size=50", "page-too-deep", []string{"first 10,000 rows", "`next`", "`after`"}, map[string]any{"limit": 10000.0, "parameter": "after"}},
		{"after=bogus", "invalid-cursor", []string{"`after`"}, map[string]any{"parameter": "after"}},
		{"page=1&after=x", "invalid-page", []string{"`page`", "`after`"}, map[string]any{"parameter": "after"}},
		{"size=5000", "invalid-page", []string{"from 1 to 200"}, map[string]any{"parameter": "size"}},
	} {
		q, _ := url.ParseQuery(tc.query)
		_, err := p.Parse(q, binding)
		if err == nil {
			t.Fatalf("%s: accepted", tc.query)
		}
		r := httptest.NewRequest(http.MethodGet, "/api/events?"+tc.query, nil)
		w := httptest.NewRecorder()
		cursor.WriteError(w, r, err)
		if w.Code != http.StatusBadRequest || w.Header().Get("Content-Type") != "application/problem+json" {
			t.Errorf("%s: %d %s", tc.query, w.Code, w.Header().Get("Content-Type"))
		}
		var body map[string]any
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v", tc.query, err)
		}
		if body["type"] != "urn:pglimit:problem:"+tc.slug || body["status"] != 400.0 || body["title"] == "" || body["instance"] != "/api/events" {
			t.Errorf("%s: body %v", tc.query, body)
		}
		detail, _ := body["detail"].(string)
		for _, want := range tc.detail {
			if !strings.Contains(detail, want) {
				t.Errorf("%s: detail %q lacks %q", tc.query, detail, want)
			}
		}
		for k, v := range tc.ext {
			if body[k] != v {
				t.Errorf("%s: %s = %v, want %v", tc.query, k, body[k], v)
			}
		}
	}
	// Anything else is a 500 with no internal text.
	w := httptest.NewRecorder()
	cursor.WriteError(w, httptest.NewRequest(http.MethodGet, "/api/events", nil), errors.New("secret internal detail"))
	if w.Code != http.StatusInternalServerError || strings.Contains(w.Body.String(), "secret") {
		t.Errorf("foreign error: %d %s", w.Code, w.Body)
	}
}
