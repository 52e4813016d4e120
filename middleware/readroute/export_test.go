package readroute

import "context"

// Names the tests reach that are not part of the package's API.

var (
	ErrRunTwice = errRunTwice
	ErrNoRoute  = errNoRoute
)

const (
	MetricReads    = metricReads
	TargetReplica  = targetReplica
	TargetPrimary  = targetPrimary
	TargetFallback = targetFallback
)

// HasReplica reports whether a replica is configured.
func (r *Router) HasReplica() bool { return r.replica != nil }

// NewContext returns ctx carrying a read route chosen now, as Handler
// gives a request.
func (r *Router) NewContext(ctx context.Context) context.Context { return r.newContext(ctx) }
