package app

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/problem"
)

// classOf is pglimit.Classify(err), except that a request whose client
// went away (its context canceled) is ClassCanceled whatever err says: pgx
// may close a connection to interrupt the statement.
func classOf(r *http.Request, err error) pglimit.Class {
	if err != nil && errors.Is(r.Context().Err(), context.Canceled) {
		return pglimit.ClassCanceled
	}
	return pglimit.Classify(err)
}

// logFailure logs a handler's failed call through the service's logger, at
// the level its class deserves: a client that went away is Debug ("the
// client went away"), a database that cannot be reached or timed out
// Warn, anything else Error.
func (a *App) logFailure(r *http.Request, err error) {
	c := classOf(r, err)
	args := []any{"method", r.Method, "path", r.URL.Path, "class", string(c), "err", err}
	switch c {
	case pglimit.ClassCanceled:
		a.log.DebugContext(r.Context(), "request canceled: the client went away", args...)
	case pglimit.ClassUnavailable, pglimit.ClassTimeout:
		a.log.WarnContext(r.Context(), "request failed: the database cannot be reached or timed out", args...)
	default:
		a.log.ErrorContext(r.Context(), "request failed", args...)
	}
}

// dbError answers a handler's failed database call: 503
// database-unavailable when PostgreSQL cannot be reached or did not answer
// in time, nothing for a client that went away, else a 500 without the
// error's text. The error is logged.
func (a *App) dbError(w http.ResponseWriter, r *http.Request, err error) {
	a.logFailure(r, err)
	switch classOf(r, err) {
	case pglimit.ClassUnavailable, pglimit.ClassTimeout:
		unavailable(w, "database-unavailable", "The database cannot be reached; try again shortly.")
	case pglimit.ClassCanceled:
	default:
		problem.Internal(w, r)
	}
}

// heavyError answers a failed heavy read with heavy.WriteError (503
// heavy-request-timed-out at the time bound), logging what is not a time
// bound.
func (a *App) heavyError(w http.ResponseWriter, r *http.Request, err error) {
	if !errors.Is(err, heavy.ErrTimedOut) {
		a.logFailure(r, err)
	}
	heavy.WriteError(w, r, err)
}

// signInUnavailable answers a sign-in whose database work failed: 503
// sign-in-unavailable, logged.
func (a *App) signInUnavailable(w http.ResponseWriter, r *http.Request, err error) {
	a.logFailure(r, err)
	if classOf(r, err) == pglimit.ClassCanceled {
		return
	}
	unavailable(w, "sign-in-unavailable", "Sign-in is unavailable: the database cannot be reached. Try again shortly.")
}

// badRequest answers 400 with the problem type slug, its title and a
// detail for the client.
func badRequest(w http.ResponseWriter, slug, title, detail string) {
	problem.Write(w, &problem.Details{Slug: slug, Title: title, Status: http.StatusBadRequest, Detail: detail})
}

// unavailable answers 503 with the problem type slug and a detail, and a
// Retry-After of 5 seconds: the database could not be reached, which
// passes.
func unavailable(w http.ResponseWriter, slug, detail string) {
	problem.Write(w, &problem.Details{Slug: slug, Title: "Service unavailable", Status: http.StatusServiceUnavailable,
		Detail: detail, RetryAfter: 5 * time.Second})
}
