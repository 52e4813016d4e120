package cursor_test

import (
	"errors"
	"net/url"
	"testing"
	"time"

	"github.com/pglimit/pglimit/cursor"
)

// FuzzDecode: Decode never panics; whatever decodes re-encodes to the same
// string; a valid cursor edited at one character never decodes.
func FuzzDecode(f *testing.F) {
	c := mustCodec(f, testKey)
	valid := c.Encode(binding, cursor.Position{At: time.Date(2026, 10, 13, 12, 0, 0, 1000, time.UTC), ID: 9})
	f.Add(valid, int64(0), int64(0), uint(0), byte('A'))
	f.Add("", int64(-1), int64(-1), uint(43), byte('_'))
	f.Add(valid[:43], int64(1760000000000000), int64(1<<62), uint(7), byte('\n'))
	f.Fuzz(func(t *testing.T, s string, us, id int64, at uint, b byte) {
		if p, err := c.Decode(binding, s); err == nil {
			if again := c.Encode(binding, p); again != s {
				t.Fatalf("%q decoded to %v, which encodes to %q", s, p, again)
			}
		} else if !errors.Is(err, cursor.ErrInvalidCursor) {
			t.Fatalf("Decode(%q): %v is not ErrInvalidCursor", s, err)
		}
		pos := cursor.Position{At: time.UnixMicro(us), ID: id}
		enc := c.Encode(binding, pos)
		got, err := c.Decode(binding, enc)
		if err != nil || got.ID != id || got.At.UnixMicro() != us {
			t.Fatalf("round trip of %v: %v, %v", pos, got, err)
		}
		i := at % uint(len(enc))
		if enc[i] == b {
			return
		}
		edited := enc[:i] + string([]byte{b}) + enc[i+1:]
		if p, err := c.Decode(binding, edited); err == nil {
			t.Fatalf("edited cursor %q (from %q) decoded to %v", edited, enc, p)
		}
	})
}

// FuzzParsePage: Parse never panics; what it accepts obeys the rules;
// what it refuses is one of the three kinds.
func FuzzParsePage(f *testing.F) {
	p := mustPager(f, cursor.Rules{})
	valid := p.Encode(binding, cursor.Position{At: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC), ID: 1})
	for _, s := range []string{"", "page=2&size=10", "page=201", "after=" + valid, "page=1&after=" + valid,
		"size=0", "page=-1", "page=1&page=1", "size=%00", "after=%0A" + valid} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		q, _ := url.ParseQuery(raw) // what a server would have parsed, errors and all
		page, err := p.Parse(q, binding)
		if err != nil {
			var e *cursor.Error
			if !errors.As(err, &e) {
				t.Fatalf("Parse(%q): %v is not a *cursor.Error", raw, err)
			}
			if !errors.Is(err, cursor.ErrInvalidPage) && !errors.Is(err, cursor.ErrPageTooDeep) && !errors.Is(err, cursor.ErrInvalidCursor) {
				t.Fatalf("Parse(%q): %v of no known kind", raw, err)
			}
			return
		}
		if page.Size < 1 || page.Size > 200 {
			t.Fatalf("Parse(%q): size %d", raw, page.Size)
		}
		if page.After != nil {
			if page.Number != 0 || len(q["page"]) != 0 || p.Encode(binding, *page.After) != q.Get("after") {
				t.Fatalf("Parse(%q): cursor mode %+v", raw, page)
			}
			return
		}
		if page.Number < 1 || page.Number*page.Size > 10000 || page.Offset() < 0 || page.Offset()+page.Size > 10000 {
			t.Fatalf("Parse(%q): page mode %+v", raw, page)
		}
	})
}
