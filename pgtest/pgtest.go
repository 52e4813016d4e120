// Package pgtest is pglimit's test kit: a real PostgreSQL database of its
// own for each test, migrated with pglimit's schema (and your migrations
// after it), without Docker, so that your tests of a handler behind
// pglimit's limits run against the database your service runs on.
//
// The server comes from, in this order: TEST_DATABASE_URL or DATABASE_URL
// (a superuser, or a role with LOGIN and CREATEDB); else a throwaway
// cluster started from the PostgreSQL server binaries installed on the
// machine (Debian: apt-get install postgresql), one per test binary,
// removed when the tests end. On a machine with Docker and no server
// binaries, the module github.com/pglimit/pglimit/pgtestdocker starts a
// container and points the kit at it (its Main in place of this Main), so
// that testcontainers and Docker's client reach only the modules of those
// who use them. A template database is migrated once per set of
// migrations and cloned for each test (CREATE DATABASE … TEMPLATE), so a
// test's database costs tens of milliseconds; it is dropped when the test
// passes and kept for inspection when it fails. When no server can be had
// the test fails with one sentence saying what to install; it never
// skips.
//
// A package whose tests use pgtest calls Main from its TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
//	func TestCheckout(t *testing.T) {
//		url := pgtest.URL(t, pgtest.Migration{FS: migrations, Table: "app_version", LockID: 42})
//		replica1, replica2 := pgtest.Pool(t, url, 4), pgtest.Pool(t, url, 4)
//		...
//	}
//
// Several pools on one URL stand in for several replicas of a service.
package pgtest

import (
	"io/fs"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// Migration is a goose migration folder of yours, applied to a test's
// database after pglimit's schema.
type Migration struct {
	// FS holds the NNNNN_name.sql files (an embed.FS or a sub-tree of one).
	FS fs.FS
	// Table is goose's version table for this folder.
	Table string
	// LockID is the advisory lock held while migrating.
	LockID int64
}

// Main runs the tests, then after, in order, and then stops the throwaway
// server, if one was started; it exits with the tests' code. Call it from
// TestMain.
func Main(m *testing.M, after ...func()) { pgtest.MainWithoutTurn(m, after...) }

// URL returns the URL of a fresh database for this test, migrated with
// pglimit's schema and then migrations, in order. It is dropped when the
// test passes and kept when it fails.
func URL(t testing.TB, migrations ...Migration) string {
	t.Helper()
	return pgtest.URL(t, own(migrations)...)
}

// Pool opens a pool of at most maxConns connections on url, closed when
// the test ends.
func Pool(t testing.TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	return pgtest.Pool(t, url, maxConns)
}

// ForExample returns a fresh migrated database for a runnable example
// (which has no testing.T) and the function that drops it. It panics when
// no server can be had.
func ForExample(migrations ...Migration) (url string, cleanup func()) {
	return pgtest.ForExample(own(migrations)...)
}

func own(ms []Migration) []pgtest.Migration {
	out := make([]pgtest.Migration, len(ms))
	for i, m := range ms {
		out[i] = pgtest.Migration{FS: m.FS, Table: m.Table, LockID: m.LockID}
	}
	return out
}
