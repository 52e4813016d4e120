// Package session runs the statements that set up or probe a connection
// for a transport (sql/queries/session.sql): a bounded read's
// statement_timeout, a read replica's ping. The transports (middleware/)
// run no SQL of their own.
package session

import (
	"context"

	"github.com/pglimit/pglimit/db"
)

var queries = db.New()

// SetStatementTimeout bounds every later statement of conn's transaction
// (SET LOCAL statement_timeout) to ms milliseconds.
func SetStatementTimeout(ctx context.Context, conn db.DBTX, ms int64) error {
	return queries.SessionSetStatementTimeout(ctx, conn, ms)
}

// Ping runs the cheapest statement on conn, to learn whether its server
// answers.
func Ping(ctx context.Context, conn db.DBTX) error { return queries.SessionPing(ctx, conn) }
