package migrate

import (
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestRetryLock: the migration lock is tried again while another migrator
// holds it or the database cannot answer, and never on a database error
// that another try cannot mend (a pooler that mixes up prepared
// statements, a missing privilege).
func TestRetryLock(t *testing.T) {
	pg := func(code string) error { return fmt.Errorf("acquire lock 1: %w", &pgconn.PgError{Code: code}) }
	for _, tc := range []struct {
		name string
		err  error
		want bool
	}{
		{"held by another migrator", errors.New("acquire lock 1: already held by another instance"), true},
		{"database starting up", pg("57P03"), true},
		{"admin shutdown", pg("57P01"), true},
		{"too many connections", pg("53300"), true},
		{"connection failure", pg("08006"), true},
		{"pooler's bind mix-up", pg("08P01"), false},
		{"prepared statement missing", pg("26000"), false},
		{"prepared statement exists", pg("42P05"), false},
		{"no privilege", pg("42501"), false},
		{"statement cancelled", pg("57014"), false},
	} {
		if got := retryLock(tc.err); got != tc.want {
			t.Errorf("%s: retry %v, want %v", tc.name, got, tc.want)
		}
	}
}
