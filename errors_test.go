package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/pglimit"
)

// TestClassify pins the class of every kind of error a limiter or a
// service's own query meets.
func TestClassify(t *testing.T) {
	t.Parallel()
	pg := func(code, msg string) error {
		return fmt.Errorf("query: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		name string
		err  error
		want pglimit.Class
	}{
		{"nil", nil, pglimit.ClassNone},
		{"canceled", fmt.Errorf("claim: %w", context.Canceled), pglimit.ClassCanceled},
		{"deadline", fmt.Errorf("claim: %w", context.DeadlineExceeded), pglimit.ClassTimeout},
		{"statement timeout", pg("57014", "canceling statement due to statement timeout"), pglimit.ClassTimeout},
		{"admin shutdown", pg("57P01", "terminating connection due to administrator command"), pglimit.ClassUnavailable},
		{"cannot connect now", pg("57P03", "the database system is starting up"), pglimit.ClassUnavailable},
		{"connection failure", pg("08006", "connection failure"), pglimit.ClassUnavailable},
		{"too many connections", pg("53300", "too many connections"), pglimit.ClassUnavailable},
		{"read-only primary (failover)", pg("25006", "cannot execute INSERT in a read-only transaction"), pglimit.ClassUnavailable},
		{"crash shutdown", pg("57P02", "terminating connection because of crash of another server process"), pglimit.ClassUnavailable},
		{"serialization failure", pg("40001", "could not serialize access due to concurrent update"), pglimit.ClassUnavailable},
		{"deadlock", pg("40P01", "deadlock detected"), pglimit.ClassUnavailable},
		{"network", &net.OpError{Op: "dial", Err: errors.New("connection refused")}, pglimit.ClassUnavailable},
		{"closed conn", errors.New("conn closed"), pglimit.ClassUnavailable},
		{"syntax error", pg("42601", "syntax error"), pglimit.ClassOther},
		{"unique violation", pg("23505", "duplicate key"), pglimit.ClassOther},
		{"no rows", pgx.ErrNoRows, pglimit.ClassOther},
		{"plain", errors.New("something else"), pglimit.ClassOther},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := pglimit.Classify(tc.err); got != tc.want {
				t.Errorf("Classify(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}

// TestClassifyConnectAndOwnTimeout: a connect that fails, even by a
// deadline, is a database that cannot be reached, not a timed-out
// statement.
func TestClassifyConnectAndOwnTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// Nothing listens on port 1; a connect fails or runs out of time.
	_, err := pgx.Connect(ctx, "postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
	if err == nil {
		t.Fatal("connect to port 1 succeeded")
	}
	if got := pglimit.Classify(err); got != pglimit.ClassUnavailable {
		t.Errorf("Classify(%v) = %v, want unavailable", err, got)
	}
}

// TestClassNames pins the names a log line or a metric attribute carries.
func TestClassNames(t *testing.T) {
	t.Parallel()
	got := fmt.Sprint([]pglimit.Class{pglimit.ClassNone, pglimit.ClassCanceled, pglimit.ClassUnavailable, pglimit.ClassTimeout, pglimit.ClassOther})
	if want := "[none canceled unavailable timeout other]"; got != want {
		t.Errorf("class names %q, want %q", got, want)
	}
}
