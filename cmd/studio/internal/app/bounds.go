package app

import (
	"context"
	"time"
)

// dbTimeout bounds the database work of every step of a request that is
// not a heavy read (a heavy read keeps its endpoint's time bound): the
// token lookup, the sign-in's statements, the operator view, an upload's
// insert, the /audit page's token check. A database that hangs rather than
// refuses fails the step within it — 503, as for a database that is down —
// instead of hanging the request. pglimit's limiters bound their own
// decisions alike (their Timeout, 5 s by default). SECURITY.md lists the
// bound of every path.
const dbTimeout = 5 * time.Second

// listingTimeout bounds the operator view's whole listing (GET
// /api/limits, the /limits page): some twenty statements, one after
// another, several of which read a limit table whole — on Citus every
// shard of it. On a loaded Citus cluster they took more than dbTimeout
// together (the load check on Citus beside a CPU hog per core: 503 once in
// three runs, "override: list: timeout"), while each stayed far within
// it. A database that hangs still fails the request at its token lookup,
// within dbTimeout.
const listingTimeout = 3 * dbTimeout

// listingContext returns ctx ending listingTimeout from now at the latest.
func listingContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, listingTimeout)
}

// dbContext returns ctx ending dbTimeout from now at the latest.
func dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, dbTimeout)
}
