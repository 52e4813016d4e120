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

// dbContext returns ctx ending dbTimeout from now at the latest.
func dbContext(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, dbTimeout)
}
