// Package schema holds the reference service's own goose migrations (its
// domain tables); pglimit's limit tables come from pglimit's schema
// package and are migrated first.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var migrations embed.FS

// FS is the folder of the service's migrations.
func FS() fs.FS { return migrations }

// VersionTable is the goose version table of the service's migrations.
const VersionTable = "studio_schema_version"

// LockID is the goose lock row held while they run.
const LockID = 0x73747564696f // "studio"

// Apply brings pool's database to the service's latest schema. Replicas
// that start together take turns through goose's lock row (LockID in
// goose_lock), retried every half second for up to five minutes; a
// database already current is left alone.
func Apply(ctx context.Context, pool *pgxpool.Pool) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableLockID(LockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 600),
		lock.WithTableLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return fmt.Errorf("studio schema: locker: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, migrations,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(VersionTable),
		goose.WithLocker(locker),
		goose.WithSlog(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return fmt.Errorf("studio schema: %w", err)
	}
	if _, err := provider.Up(ctx); err != nil {
		return fmt.Errorf("studio schema: migrate: %w", err)
	}
	return nil
}
