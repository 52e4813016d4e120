package problem

// This file keeps, for the time it takes their callers to move, the names
// that left the package's API (issue 20). Nothing outside middleware/heavy,
// inflight, upload, signin and ratelimit calls them; delete the file once
// those packages no longer do.

import (
	"net/http"
	"time"

	"github.com/pglimit/pglimit/internal/retryafter"
)

// MediaType is the content type of a problem details body.
//
// Deprecated: write "application/problem+json".
const MediaType = mediaType

// RetryAfterSeconds rounds d up to whole seconds, at least 1.
//
// Deprecated: use retryafter.Seconds (internal/retryafter).
func RetryAfterSeconds(d time.Duration) int { return retryafter.Seconds(d) }

// Unavailable sends a 503 with the given slug and detail and a Retry-After
// of 5 seconds.
//
// Deprecated: use respond.Unavailable (internal/respond).
func Unavailable(w http.ResponseWriter, _ *http.Request, slug, detail string) {
	Write(w, &Details{Slug: slug, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail, RetryAfter: 5 * time.Second})
}

// BadRequest sends a 400 with the given slug, title and detail.
//
// Deprecated: use respond.BadRequest (internal/respond), or Write.
func BadRequest(w http.ResponseWriter, slug, title, detail string) {
	Write(w, &Details{Slug: slug, Title: title, Status: http.StatusBadRequest, Detail: detail})
}
