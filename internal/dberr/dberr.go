// Package dberr holds the predicates behind pglimit.Classify, the one
// public place database errors are classified: a database that cannot be
// reached, a statement stopped by its time bound, a read replica's
// recovery conflict, a limiter's own Timeout.
package dberr

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// QueryCanceled is SQLSTATE 57014: statement_timeout or a cancel request.
const QueryCanceled = "57014"

// IsTimeout reports whether err is a statement the database stopped
// (statement_timeout, or a cancel sent when the context's deadline passed)
// or a context deadline.
func IsTimeout(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) {
		return true
	}
	var pg *pgconn.PgError
	return errors.As(err, &pg) && pg.Code == QueryCanceled
}

// IsCanceled reports whether err ended work whose caller went away: ctx
// (the caller's own, e.g. a request's) was canceled. Whatever err says
// then — context canceled, a connection pgx closed to interrupt its
// statement, a claim abandoned — it is neither the database's failure nor
// the server's, and nobody is left to answer. A context that reached its
// deadline is not canceled: that is a timeout.
func IsCanceled(ctx context.Context, err error) bool {
	return err != nil && errors.Is(ctx.Err(), context.Canceled)
}

// RecoveryConflict is SQLSTATE 40001 as a hot standby sends it when it
// cancels a read that conflicts with the WAL it replays.
const RecoveryConflict = "40001"

// IsRecoveryConflict reports whether a read replica canceled the statement
// because it conflicted with recovery (40001, or 40P01 for a buffer-pin
// deadlock): the read may succeed on the primary.
func IsRecoveryConflict(err error) bool {
	var pg *pgconn.PgError
	return errors.As(err, &pg) && (pg.Code == RecoveryConflict || pg.Code == "40P01") && strings.Contains(pg.Message, "conflict with recovery")
}

// ReadOnly is SQLSTATE 25006, read_only_sql_transaction: what a primary
// demoted during a failover (now a standby, or set read-only) answers a
// write. A limit's decision is a write: it cannot be made there now, and
// the promoted primary will make it.
const ReadOnly = "25006"

// IsUnavailable reports whether err says the database cannot decide now:
// a failed connect, a broken connection, a server shutting down or
// starting up, too many connections, a read-only primary (25006: a
// failover), or a transaction the database rolled back to retry
// (40001 serialization failure, 40P01 deadlock).
func IsUnavailable(err error) bool {
	if err == nil {
		return false
	}
	if IsOwnTimeout(err) {
		return true
	}
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pg *pgconn.PgError
	if errors.As(err, &pg) {
		switch pg.Code[:2] {
		case "08": // connection exception
			return true
		case "57": // operator intervention: admin/crash shutdown, cannot connect now
			return pg.Code != QueryCanceled
		case "53": // insufficient resources: too many connections, out of memory
			return true
		case "40": // transaction rollback: serialization failure, deadlock; a retry decides
			return pg.Code == "40001" || pg.Code == "40P01"
		}
		return pg.Code == ReadOnly
	}
	var netErr net.Error
	if errors.As(err, &netErr) {
		return true
	}
	if pgconn.SafeToRetry(err) || pgconn.Timeout(err) {
		return true
	}
	var opErr *net.OpError
	if errors.As(err, &opErr) {
		return true
	}
	s := err.Error()
	for _, frag := range []string{"conn closed", "connection refused", "broken pipe", "connection reset", "unexpected EOF", "closed pool"} {
		if strings.Contains(s, frag) {
			return true
		}
	}
	return false
}
