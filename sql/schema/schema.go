// Package schema holds pglimit's goose migrations; pglimit.Migrate applies
// them.
//
// What it guarantees: every pglimit table lives in the PostgreSQL schema
// pglimit, and so do goose's version table for pglimit's migrations
// (pglimit.goose_db_version, VersionTable) and its lock table
// (pglimit.goose_lock): pglimit never touches a table of the service it
// runs in, nor the service's own goose history, and a service may have
// tables of the same names in its own schemas. pglimit.Migrate is safe to
// call from every replica at once: one replica migrates while the others
// wait, and a database that is already current is left alone.
//
// What it costs: a few statements at start-up when the database is
// current; the migrations themselves run once per database.
//
// How it fails: a replica that cannot take the migration lock within five
// minutes returns an error; one that dies while migrating lets go of the
// lock when its 30 s lease lapses. The lock is a row of pglimit.goose_lock,
// not a session advisory lock, so migrating also works through PgBouncer
// in transaction pooling mode.
//
// A service that applies the migrations with goose itself creates the
// schema pglimit first, gives goose the folder FS, keeps their history in
// VersionTable and, with goose's Postgres table locker, locks the row
// LockID. On Citus it then calls pglimit.Migrate as well, which finds the
// migrations applied and distributes the limit tables.
package schema

import (
	"embed"
	"io/fs"
)

//go:embed *.sql citus/distribute.sql
var migrations embed.FS

// FS is the folder of pglimit's migrations, 00001_name.sql and so on, for a
// service that applies them with goose itself (goose reads the folder's
// own files; citus/distribute.sql, which pglimit.Migrate runs on a Citus
// coordinator, is beside them).
func FS() fs.FS { return migrations }

// VersionTable is the goose version table of pglimit's migrations.
const VersionTable = "pglimit.goose_db_version"

// LockID is the row of the goose lock table (pglimit.goose_lock) that
// serialises concurrent migrators of pglimit's schema; it differs from
// goose's default so that a service's own migrations and pglimit's can run
// side by side.
const LockID = 0x70676c696d6974 // "pglimit"
