// Package cursor pages history reads: by page number over the first rows,
// with a total, and by an opaque keyset cursor beyond them, at the same cost
// at any depth. It is pure Go: it validates the paging parameters, signs
// and verifies cursors, and does the arithmetic a handler needs; the SQL
// stays with the handler (in sqlc queries).
//
// What it guarantees: a request it accepts is within the rules (a size the
// server allows, a page number that reaches no further than the first
// Rules.Limit rows), and a cursor it accepts is one this service signed for
// this very query. What it costs: one HMAC-SHA256 of a few dozen
// bytes per cursor read or written, and no database work of its own; the
// queries it asks for cost the same at any depth, and the page-mode total
// counts at most Limit+1 rows. How it fails: every refusal is an error
// matching ErrInvalidPage, ErrPageTooDeep or ErrInvalidCursor, answered
// 400 by WriteError, before any SQL runs.
//
// # Paging rules
//
// A history request gives `page` (1-based) and `size`, or `after` (a
// cursor) and `size`, never both `page` and `after`. size is 1..200
// (default 50); page defaults to 1. Page numbers reach the first 10,000
// rows: a page whose rows would go past row 10,000 (page*size > 10,000,
// e.g. page 201 of size 50) is refused with 400 page-too-deep, whose detail
// names the `next` cursor and the `after` parameter. Anything else malformed
// (negative, zero, not a number, more than 9 digits, a size above the
// maximum, a repeated parameter, page and after together) is 400
// invalid-page; a cursor that does not verify is 400 invalid-cursor. The
// limits are Rules; WriteError writes the same problem+json body on every
// endpoint.
//
// A Pager is made once with NewPager and shared; Parse checks a request,
// Next signs the cursor of the next page, CountLimit and Total cap the
// page-mode count.
//
// # Cursors
//
// A cursor is opaque to clients: a version byte, a keyset position (a time
// in microseconds, as PostgreSQL stores a timestamptz, and an int64 id) and
// a 16-byte HMAC-SHA256 tag, in unpadded base64url (one alphabet, both
// ways), 44 characters. The tag covers a binding the caller gives, the
// endpoint's name and its canonical filters (Binding), so a cursor of
// /api/events is refused on /api/audit and a cursor made for other filters
// is refused too. A forged, edited, truncated, extended, oversized (over
// 256 bytes it is refused before it is decoded) or foreign cursor is
// ErrInvalidCursor and never reaches SQL. Tags are compared in constant
// time (hmac.Equal). A cursor never expires: it names a position, not a
// snapshot, so the rows after it are read as they are when it is used.
//
// Replicas must share one key of at least 16 bytes through configuration
// (NewCodec): a cursor from one replica fails on a replica with another
// key. NewPager with a nil codec is for a single process only.
//
// # What a handler runs
//
// With an index on (occurred_at, id):
//
//	page, err := pager.Parse(r.URL.Query(), binding)
//	if err != nil { cursor.WriteError(w, r, err); return }
//
// Page mode (page.After nil), with a total:
//
//	SELECT ... FROM t WHERE <filters>
//	ORDER BY occurred_at DESC, id DESC
//	LIMIT @size OFFSET @offset              -- page.Size, page.Offset()
//
//	SELECT count(*) FROM (SELECT 1 FROM t WHERE <filters> LIMIT @cap) s
//	                                        -- @cap = pager.CountLimit() = 10,001
//	total, capped := pager.Total(count)     -- "total", "totalCapped"
//
// Cursor mode (page.After set), no total, the same cost at any depth:
//
//	SELECT ... FROM t WHERE <filters>
//	  AND (occurred_at, id) < (@at, @id)    -- page.After.At, page.After.ID
//	ORDER BY occurred_at DESC, id DESC
//	LIMIT @size
//
// In both modes the response's next is pager.Next(binding, page, len(rows),
// last row's Position): a cursor when the page was full (more rows may
// follow), else none (JSON null). A client reading past row 10,000 takes
// next of page 200 and passes it as after. The row comparison
// (occurred_at, id) < (@at, @id) must be written as a row comparison, so
// PostgreSQL walks the index backwards from the position.
//
// # The total
//
// Page mode reports a total, but only as far as page numbers reach: the
// count is capped at Limit+1 rows (SELECT count(*) FROM (SELECT 1 ... LIMIT
// 10001) s). Up to 10,000 it is exact; beyond, the response says total
// 10,000 and "totalCapped": true ("more than 10,000"). An exact count of a
// large table costs a scan of every matching row on every page request;
// the capped one stops after 10,001, which is also all that page numbers
// can show. Cursor mode reports no total.
//
// BenchmarkPage and BenchmarkTotal in this package measure both on a
// 2,000,000-row table (go test -run '^$' -bench 'Page|Total' ./cursor/; the
// fixture takes about 10 s to build per benchmark function, -short builds
// 20,000 rows, BENCH_EVENT_ROWS sets any size), and BENCHMARKS.md in the
// repository gives the figures under load ("History pages: keyset against
// OFFSET"): a keyset page costs the same at any depth where an OFFSET page
// grows with it, and the capped count stays near a page's cost where an
// exact count scans the table.
//
// Pager and Codec are safe for concurrent use.
package cursor
