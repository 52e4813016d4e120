package migrate_test

import (
	"testing"

	"github.com/pglimit/pglimit/internal/migrate"
	"github.com/pglimit/pglimit/sql/schema"
)

// TestPglimitVersionTable: Apply creates the schema pglimit before
// migrating exactly when it applies pglimit's own migrations.
func TestPglimitVersionTable(t *testing.T) {
	if got := migrate.PglimitVersionTable; got != schema.VersionTable {
		t.Fatalf("internal/migrate creates the schema for %q, but pglimit's version table is %q", got, schema.VersionTable)
	}
}
