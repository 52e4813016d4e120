package jolokia

import (
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/problem"
)

// Problem type slugs of failed node calls.
const (
	// SlugUnreachable: the node did not answer or answered garbage (502).
	SlugUnreachable = "node-unreachable"
	// SlugBusy: the request ended before its turn to call the node (503).
	SlugBusy = "node-busy"
)

// WriteError answers a failed node call as problem+json: 502
// node-unreachable for ErrNode, 503 node-busy with Retry-After 1 for
// nodelimit.ErrNoTurn (and a request whose context ended), 500 otherwise.
// The error's text goes to log, never to the client.
func WriteError(w http.ResponseWriter, r *http.Request, log *slog.Logger, node string, err error) {
	switch {
	case errors.Is(err, ErrNode):
		log.WarnContext(r.Context(), "broker node call failed", "node", node, "path", r.URL.Path, "err", err)
		problem.Write(w, &problem.Details{
			Slug: SlugUnreachable, Title: "Broker node unreachable", Status: http.StatusBadGateway,
			Detail:     "The broker node " + node + " did not answer, or did not answer as Jolokia does.",
			Instance:   r.URL.Path,
			Extensions: map[string]any{"node": node},
		})
	case errors.Is(err, nodelimit.ErrNoTurn) || r.Context().Err() != nil:
		problem.Write(w, &problem.Details{
			Slug: SlugBusy, Title: "Broker node busy", Status: http.StatusServiceUnavailable,
			Detail:     "The calls to broker node " + node + " are at their rate; the request ended before its turn. Try again shortly.",
			Instance:   r.URL.Path,
			RetryAfter: time.Second,
			Extensions: map[string]any{"node": node},
		})
	default:
		log.ErrorContext(r.Context(), "broker node call failed", "node", node, "path", r.URL.Path, "err", err)
		problem.Internal(w, r)
	}
}
