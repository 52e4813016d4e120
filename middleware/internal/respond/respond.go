// Package respond answers and logs, the same way in every middleware, the
// errors of a decision: the middleware's own refusal (Refusal picks it
// out, TooMany writes its 429), a database that cannot be reached or did
// not answer in time (503), a client that went away (nothing), anything
// else (500, no internal text).
package respond

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/problem"
)

// SlugUnavailable and DetailUnavailable are the 503 every middleware but
// signin sends when its database cannot be reached.
const (
	SlugUnavailable   = "database-unavailable"
	DetailUnavailable = "The database cannot be reached; try again shortly."
)

// Error writes the answer to err by its class: 503 slug/detail with
// Retry-After for pglimit.ClassUnavailable and ClassTimeout, nothing when
// the client went away (ClassCanceled, or r's context canceled whatever
// err says: pgx may close a connection to interrupt a statement), and a
// 500 without the error's text otherwise.
func Error(w http.ResponseWriter, r *http.Request, err error, slug, detail string) {
	switch Class(r.Context(), err) {
	case vocab.ClassUnavailable, vocab.ClassTimeout:
		Unavailable(w, r, slug, detail)
	case vocab.ClassCanceled:
		// Nothing useful can reach a client that went away.
	default:
		problem.Internal(w, r)
	}
}

// Unavailable sends a 503 with the given slug and detail and a
// Retry-After of 5 seconds: the database could not be reached, which
// passes.
func Unavailable(w http.ResponseWriter, _ *http.Request, slug, detail string) {
	problem.Write(w, &problem.Details{
		Slug:       slug,
		Title:      "Service unavailable",
		Status:     http.StatusServiceUnavailable,
		Detail:     detail,
		RetryAfter: 5 * time.Second,
	})
}

// BadRequest sends a 400 with the given slug, title and detail.
func BadRequest(w http.ResponseWriter, slug, title, detail string) {
	problem.Write(w, &problem.Details{Slug: slug, Title: title, Status: http.StatusBadRequest, Detail: detail})
}

// Class is vocab.ClassOf: pglimit.Classify(err), except that work whose
// caller's ctx was canceled is ClassCanceled whatever err says.
func Class(ctx context.Context, err error) vocab.Class { return vocab.ClassOf(ctx, err) }

// Database is Error with the 503 database-unavailable.
func Database(w http.ResponseWriter, r *http.Request, err error) {
	Error(w, r, err, SlugUnavailable, DetailUnavailable)
}

// Log is vocab.LogFailure: err logged at the level its class deserves.
func Log(ctx context.Context, log *slog.Logger, msg string, err error, args ...any) {
	vocab.LogFailure(ctx, log, msg, err, args...)
}

// Refusal returns err's *limit.Refusal when it is one of kind, for the
// WriteError of that kind's middleware to answer; any other err it answers
// itself, as Database does, and returns nil.
func Refusal(w http.ResponseWriter, r *http.Request, err error, kind string) *limit.Refusal {
	var e *limit.Refusal
	if errors.As(err, &e) && e.Kind == kind {
		return e
	}
	Database(w, r, err)
	return nil
}

// TooMany writes d as the 429 of a refusal: Status 429, Instance r's path
// and a Retry-After of retry seconds (retryafter.Seconds of the refusal's
// RetryAfter, which d's Detail and Extensions may also name).
func TooMany(w http.ResponseWriter, r *http.Request, d *problem.Details, retry int) {
	d.Status = http.StatusTooManyRequests
	d.Instance = r.URL.Path
	d.RetryAfter = time.Duration(retry) * time.Second
	problem.Write(w, d)
}
