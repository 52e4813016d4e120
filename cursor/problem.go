package cursor

import (
	"errors"
	"net/http"

	"github.com/pglimit/pglimit/problem"
)

// WriteError answers a request Parse refused with a 400
// application/problem+json body, the same on every endpoint, whose type
// ends with one of these slugs:
//
//   - page-too-deep (ErrPageTooDeep): the detail says how many rows page
//     numbers reach and names the `next` cursor and the `after` parameter;
//     members "limit" (the row count) and "parameter": "after".
//   - invalid-cursor (ErrInvalidCursor): member "parameter": "after".
//   - invalid-page (ErrInvalidPage): member "parameter" names the
//     parameter at fault ("page", "size" or "after").
//
// An error Parse did not return is a server error: 500, with no internal
// text. WriteError logs nothing; log such an error yourself.
func WriteError(w http.ResponseWriter, r *http.Request, err error) {
	var e *pageError
	if !errors.As(err, &e) {
		problem.Internal(w, r)
		return
	}
	d := &problem.Details{
		Status:     http.StatusBadRequest,
		Detail:     e.detail,
		Instance:   r.URL.Path,
		Extensions: map[string]any{"parameter": e.param},
	}
	switch e.kind {
	case ErrPageTooDeep:
		d.Slug, d.Title = "page-too-deep", "Page too deep"
		d.Extensions = map[string]any{"limit": e.limit, "parameter": paramAfter}
	case ErrInvalidCursor:
		d.Slug, d.Title = "invalid-cursor", "Invalid cursor"
	default:
		d.Slug, d.Title = "invalid-page", "Invalid page"
		if e.detail == "" {
			d.Detail = "Page with `page` and `size`, or with `after` and `size`."
		}
		if e.param == "" {
			d.Extensions = nil
		}
	}
	problem.Write(w, d)
}
