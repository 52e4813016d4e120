// Package schema holds the reference service's own goose migrations (its
// domain tables); pglimit's limit tables come from pglimit's schema
// package and are migrated first.
package schema

import (
	"embed"
	"io/fs"

	pglimitschema "github.com/pglimit/pglimit/sql/schema"
)

//go:embed *.sql
var migrations embed.FS

// FS is the folder of the service's migrations.
func FS() fs.FS { return migrations }

// VersionTable is the goose version table of the service's migrations.
const VersionTable = "studio_schema_version"

// LockID is the goose lock row held while they run.
const LockID = 0x73747564696f // "studio"

// Migration is the service's migrations as pglimit's schema package
// applies them.
func Migration() pglimitschema.Migration {
	return pglimitschema.Migration{FS: migrations, VersionTable: VersionTable, LockID: LockID}
}
