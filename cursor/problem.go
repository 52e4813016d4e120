package cursor

import (
	"errors"
	"net/http"

	"github.com/pglimit/pglimit/problem"
)

// Problem type slugs of paging refusals (all HTTP 400).
const (
	SlugInvalidPage   = "invalid-page"
	SlugPageTooDeep   = "page-too-deep"
	SlugInvalidCursor = "invalid-cursor"
)

// WriteError answers a request Parse refused: 400 invalid-page,
// page-too-deep or invalid-cursor, the same body on every endpoint. An
// error that is not a *Error is a server error (500, no internal text);
// log it yourself, WriteError logs nothing.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *Error
	if !errors.As(err, &e) {
		problem.Internal(w, r)
		return
	}
	switch e.Kind {
	case ErrPageTooDeep:
		WritePageTooDeep(w, r, e.Limit)
	case ErrInvalidCursor:
		WriteInvalidCursor(w, r)
	default:
		WriteInvalidPage(w, r, e.Param, e.Detail)
	}
}

// WriteInvalidPage writes 400 invalid-page for the parameter param ("page",
// "size" or "after"; may be empty) with detail.
func WriteInvalidPage(w http.ResponseWriter, r *http.Request, param, detail string) {
	if detail == "" {
		detail = "Page with `page` and `size`, or with `after` and `size`."
	}
	d := &problem.Details{
		Slug:     SlugInvalidPage,
		Title:    "Invalid page",
		Status:   http.StatusBadRequest,
		Detail:   detail,
		Instance: r.URL.Path,
	}
	if param != "" {
		d.Extensions = map[string]any{"parameter": param}
	}
	problem.Write(w, d)
}

// WritePageTooDeep writes 400 page-too-deep: page numbers reach the first
// limit rows, and the detail names the `next` cursor and the `after`
// parameter. The body carries "limit" and "parameter": "after".
func WritePageTooDeep(w http.ResponseWriter, r *http.Request, limit int) {
	problem.Write(w, &problem.Details{
		Slug:       SlugPageTooDeep,
		Title:      "Page too deep",
		Status:     http.StatusBadRequest,
		Detail:     TooDeepDetail(limit),
		Instance:   r.URL.Path,
		Extensions: map[string]any{"limit": limit, "parameter": ParamAfter},
	})
}

// WriteInvalidCursor writes 400 invalid-cursor.
func WriteInvalidCursor(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, &problem.Details{
		Slug:       SlugInvalidCursor,
		Title:      "Invalid cursor",
		Status:     http.StatusBadRequest,
		Detail:     InvalidCursorDetail,
		Instance:   r.URL.Path,
		Extensions: map[string]any{"parameter": ParamAfter},
	})
}
