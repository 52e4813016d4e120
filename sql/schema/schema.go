// Package schema holds pglimit's goose migrations and applies them.
//
// A service calls Migrate once at start-up, from every replica if it likes:
// goose's PostgreSQL session lock lets one replica migrate while the others
// wait, and a database that is already current is left alone. pglimit keeps
// its own version table (pglimit_schema_version), so it never touches the
// service's own goose history.
package schema

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var migrations embed.FS

// FS is the folder of pglimit's migrations, 00001_name.sql and so on.
func FS() fs.FS { return migrations }

// VersionTable is the goose version table pglimit migrates with.
const VersionTable = "pglimit_schema_version"

// LockID is the session advisory lock that serialises concurrent migrators
// of pglimit's schema; it differs from goose's default so a service's own
// migrations and pglimit's can run side by side.
const LockID = 0x70676c696d6974 // "pglimit"

// Migrate brings pool's database to pglimit's latest schema. It is safe to
// call concurrently from several replicas.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return MigrateFS(ctx, pool, migrations, VersionTable, LockID)
}

// MigrateFS applies the goose migrations in fsys to pool's database, keeping
// their history in versionTable and holding the session advisory lock
// lockID while it runs. It is what Migrate does for pglimit's own schema; a
// service can use it for its own (cmd/studio does).
func MigrateFS(ctx context.Context, pool *pgxpool.Pool, fsys fs.FS, versionTable string, lockID int64) error {
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	return MigrateDB(ctx, db, fsys, versionTable, lockID)
}

// MigrateDB is MigrateFS over a database/sql handle (test harnesses have
// one).
func MigrateDB(ctx context.Context, db *sql.DB, fsys fs.FS, versionTable string, lockID int64) error {
	// Retry the lock every second for up to five minutes: replicas that
	// start together wait for the first one instead of failing.
	locker, err := lock.NewPostgresSessionLocker(lock.WithLockID(lockID), lock.WithLockTimeout(1, 300))
	if err != nil {
		return fmt.Errorf("schema: locker: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(versionTable),
		goose.WithSessionLocker(locker),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("schema: migrate: %w", err)
	}
	return nil
}
