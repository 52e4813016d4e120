package cursor

import (
	"errors"
	"fmt"
	"net/url"
)

// Defaults of Rules.
const (
	defaultSize    = 50
	defaultMaxSize = 200
	defaultLimit   = 10000
)

// Query parameters of a history request.
const (
	paramPage  = "page"
	paramSize  = "size"
	paramAfter = "after"
)

// maxDigits bounds a page or size parameter; a longer number is refused as
// invalid-page, never parsed.
const maxDigits = 9

// The errors Parse returns match one of these (errors.Is). Their text is
// written for a client and never holds internal text or the client's own
// input; WriteError answers them.
var (
	// ErrInvalidPage: page, size or after is malformed, out of range,
	// repeated, or page and after are both given. HTTP 400 invalid-page.
	ErrInvalidPage = errors.New("cursor: invalid page")
	// ErrPageTooDeep: the page number reaches past the rows page numbers
	// reach. HTTP 400 page-too-deep.
	ErrPageTooDeep = errors.New("cursor: page too deep")
	// ErrInvalidCursor: the after cursor is not one this service wrote for
	// this query. HTTP 400 invalid-cursor.
	ErrInvalidCursor = errors.New("cursor: invalid cursor")
)

// pageError is a refused page request: its kind (one of the sentinels),
// the query parameter at fault ("page", "size" or "after"), a detail for
// the client, and for page-too-deep how many rows page numbers reach.
type pageError struct {
	kind   error
	param  string
	detail string
	limit  int
}

func (e *pageError) Error() string { return e.kind.Error() + ": " + e.detail }

// Is reports whether target is e's kind.
func (e *pageError) Is(target error) bool { return target == e.kind }

// invalidCursorDetail is the detail of invalid-cursor.
const invalidCursorDetail = "The `after` cursor is not one this endpoint returned for this query. Pass the `next` value of a page of the same query unchanged, or start again from page 1."

func invalidCursor() *pageError {
	return &pageError{kind: ErrInvalidCursor, param: paramAfter, detail: invalidCursorDetail}
}

func invalidPage(param, detail string) *pageError {
	return &pageError{kind: ErrInvalidPage, param: param, detail: detail}
}

// Rules are the paging rules of history endpoints. A zero field takes its
// default.
type Rules struct {
	// MaxSize is the largest page size a request may ask for, at most
	// 999,999,999. Default 200.
	MaxSize int
	// DefaultSize is the page size when a request gives none, from 1 to
	// MaxSize. Default 50, or MaxSize when that is smaller.
	DefaultSize int
	// Limit is how many rows page numbers reach: a page whose rows would go
	// past row Limit (page*size > Limit) is refused with page-too-deep. It
	// is also the cap of the page-mode total. At least MaxSize. Default
	// 10,000, or MaxSize when that is larger.
	Limit int
}

func (r Rules) withDefaults() (Rules, error) {
	if r.MaxSize == 0 {
		r.MaxSize = defaultMaxSize
	}
	if r.DefaultSize == 0 {
		r.DefaultSize = min(defaultSize, r.MaxSize)
	}
	if r.Limit == 0 {
		r.Limit = max(defaultLimit, r.MaxSize)
	}
	switch {
	case r.MaxSize < 1 || r.MaxSize > 999_999_999:
		return r, errors.New("cursor: Rules.MaxSize out of range")
	case r.DefaultSize < 1 || r.DefaultSize > r.MaxSize:
		return r, errors.New("cursor: Rules.DefaultSize must be from 1 to MaxSize")
	case r.Limit < r.MaxSize:
		return r, errors.New("cursor: Rules.Limit must be at least MaxSize")
	}
	return r, nil
}

// Page is a validated history request: either page mode (a page number,
// with a total) or cursor mode (rows after a position, no total).
type Page struct {
	// Number is the 1-based page number in page mode, 0 in cursor mode.
	Number int
	// Size is the number of rows asked for, 1..MaxSize.
	Size int
	// After is the position to read after in cursor mode, nil in page mode.
	After *Position
}

// Offset is the OFFSET of page mode, (Number-1)*Size; 0 in cursor mode.
func (p Page) Offset() int {
	if p.Number < 1 {
		return 0
	}
	return (p.Number - 1) * p.Size
}

// full reports whether a page that returned rows rows was full, so that more
// rows may follow it.
func (p Page) full(rows int) bool { return p.Size > 0 && rows >= p.Size }

// Pager applies the paging rules and signs cursors. It is safe for
// concurrent use; make one at start-up and share it.
type Pager struct {
	codec *Codec
	rules Rules
}

// NewPager returns a Pager signing with codec under rules (zero fields take
// their defaults); it refuses rules out of range. A nil codec is a codec
// with a random 32-byte key, which is right only for a single process (its
// cursors are refused by every other process, and by this one after a
// restart): replicas must share a key (see Codec).
func NewPager(codec *Codec, rules Rules) (*Pager, error) {
	rules, err := rules.withDefaults()
	if err != nil {
		return nil, err
	}
	if codec == nil {
		codec = newRandomCodec()
	}
	return &Pager{codec: codec, rules: rules}, nil
}

// Parse validates the paging parameters of q for the query named by
// binding (the same binding the cursor was made with; see Binding) and
// decodes the cursor. Other parameters of q (filters) are ignored.
//
//   - page (1-based) and size, or after and size; never page and after.
//   - size is 1..MaxSize, default Rules.DefaultSize; page defaults to 1.
//   - Each parameter at most once; numbers are plain decimal digits, at most
//     9 of them.
//
// The error matches ErrInvalidPage for anything malformed,
// ErrPageTooDeep for a page number whose rows would reach past Limit,
// ErrInvalidCursor for a cursor that does not verify. Answer it with
// WriteError.
func (p *Pager) Parse(q url.Values, binding string) (Page, error) {
	pageS, hasPage, err := single(q, paramPage)
	if err != nil {
		return Page{}, err
	}
	afterS, hasAfter, err := single(q, paramAfter)
	if err != nil {
		return Page{}, err
	}
	sizeS, hasSize, err := single(q, paramSize)
	if err != nil {
		return Page{}, err
	}
	if hasPage && hasAfter {
		return Page{}, invalidPage(paramAfter, "Give either `page` or `after`, not both.")
	}
	size := p.rules.DefaultSize
	if hasSize {
		n, ok := number(sizeS)
		if !ok || n < 1 || n > p.rules.MaxSize {
			return Page{}, invalidPage(paramSize, fmt.Sprintf("`size` must be a whole number from 1 to %d.", p.rules.MaxSize))
		}
		size = n
	}
	if hasAfter {
		if len(afterS) > maxLen {
			return Page{}, invalidCursor()
		}
		pos, err := p.codec.decode(binding, afterS)
		if err != nil {
			return Page{}, err
		}
		return Page{Size: size, After: &pos}, nil
	}
	page := 1
	if hasPage {
		n, ok := number(pageS)
		if !ok || n < 1 {
			return Page{}, invalidPage(paramPage, "`page` must be a whole number from 1; the first page is 1.")
		}
		page = n
	}
	// page*size > Limit, without overflow.
	if page > p.rules.Limit/size {
		return Page{}, &pageError{kind: ErrPageTooDeep, param: paramPage, limit: p.rules.Limit,
			detail: tooDeepDetail(p.rules.Limit)}
	}
	return Page{Number: page, Size: size}, nil
}

// tooDeepDetail is the detail of page-too-deep: it names the `next` cursor
// and the `after` parameter.
func tooDeepDetail(limit int) string {
	return fmt.Sprintf("Page numbers reach the first %s rows. To read further, pass the `next` cursor of the last page as the `after` parameter (or narrow the query, e.g. a shorter time range).", thousands(limit))
}

// single returns the one value of q[name]; a repeated parameter is
// invalid-page.
func single(q url.Values, name string) (string, bool, error) {
	vs, ok := q[name]
	if !ok {
		return "", false, nil
	}
	if len(vs) != 1 {
		return "", true, invalidPage(name, fmt.Sprintf("Give `%s` at most once.", name))
	}
	return vs[0], true, nil
}

// number parses 1 to 9 ASCII digits (no sign, no space).
func number(s string) (int, bool) {
	if len(s) == 0 || len(s) > maxDigits {
		return 0, false
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// Next returns the cursor that reads on after page, whose last row is last,
// when page returned rows rows: the empty string when the page was not full
// (no more rows can follow), else a cursor of last for binding, last.At
// kept to the microsecond, rounded down. Page mode returns one too, so a
// client reading past Limit switches to after.
func (p *Pager) Next(binding string, page Page, rows int, last Position) string {
	if !page.full(rows) {
		return ""
	}
	return p.codec.encode(binding, last)
}

// CountLimit is the LIMIT of the capped count: Limit+1 rows, enough to tell
// "exactly Limit" from "more than Limit".
func (p *Pager) CountLimit() int { return p.rules.Limit + 1 }

// Total turns the capped count (at most CountLimit) into the total of a
// page-mode response: the exact count up to Limit; beyond it, Limit with
// capped true, meaning "more than Limit rows" (send it as e.g.
// "totalCapped": true).
func (p *Pager) Total(count int64) (total int64, capped bool) {
	if count > int64(p.rules.Limit) {
		return int64(p.rules.Limit), true
	}
	return count, false
}

// Binding names the query a cursor belongs to: the endpoint and its
// canonical filters, e.g. Binding("event-history", url.Values{"type":
// {"alert"}, "from": {"2026-01-01T00:00:00Z"}}). Filters are sorted by name
// (values keep their order). Give the filters after parsing and normalising
// them (a time in one format, defaults filled in), so that the same query
// always has the same binding; leave the paging parameters out.
func Binding(endpoint string, filters url.Values) string {
	if len(filters) == 0 {
		return endpoint
	}
	return endpoint + "?" + filters.Encode()
}

// thousands writes n with comma separators: 10000 → "10,000".
func thousands(n int) string {
	s := fmt.Sprint(n)
	if n < 0 || len(s) <= 3 {
		return s
	}
	var b []byte
	for i := range len(s) {
		if i > 0 && (len(s)-i)%3 == 0 {
			b = append(b, ',')
		}
		b = append(b, s[i])
	}
	return string(b)
}
