// Package migrate applies a folder of goose migrations to a database, as
// package sql/schema does for pglimit's own schema and the test harness
// does for a service's: goose's Provider over an fs.FS (never the global
// registry), its history in a version table of its own, and a lock row
// that lets one migrator run while the others wait.
package migrate

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/sql/schema"
)

// Migration is one folder of goose migrations and where goose keeps its
// history.
type Migration struct {
	// FS holds the NNNNN_name.sql files.
	FS fs.FS
	// VersionTable is goose's version table, optionally schema-qualified.
	VersionTable string
	// LockID is the lock row held while migrating, in the goose_lock table
	// of VersionTable's schema (or the default schema). It must be
	// positive.
	LockID int64
}

// lockTable is the goose lock table beside m's version table.
func (m Migration) lockTable() string {
	if s, _, ok := strings.Cut(m.VersionTable, "."); ok {
		return s + ".goose_lock"
	}
	return "goose_lock"
}

// Apply applies the migrations m on pool's database. It is safe to call
// concurrently from several replicas: one migrates while the others wait.
func Apply(ctx context.Context, pool *pgxpool.Pool, m Migration) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	return ApplyDB(ctx, sqlDB, m)
}

// ApplyDB is Apply over a database/sql handle on the pgx driver.
func ApplyDB(ctx context.Context, sqlDB *sql.DB, m Migration) error {
	if m.FS == nil || m.VersionTable == "" || m.LockID <= 0 {
		return errors.New("schema: a migration needs an FS, a version table and a positive lock id")
	}
	if m.VersionTable == schema.VersionTable {
		// goose creates its version table, not the schema it lives in.
		if err := createSchema(ctx, sqlDB); err != nil {
			return err
		}
	}
	// Retry the lock every half second for up to five minutes: replicas
	// that start together wait for the first one instead of failing. A
	// migrator that dies lets go of the lock when its 30 s lease lapses.
	locker, err := lock.NewPostgresTableLocker(
		lock.WithTableName(m.lockTable()),
		lock.WithTableLockID(m.LockID),
		lock.WithTableLockTimeout(500*time.Millisecond, 600),
		lock.WithTableRetryPolicy(retryLock),
		lock.WithTableLogger(slog.New(slog.DiscardHandler)),
	)
	if err != nil {
		return fmt.Errorf("schema: locker: %w", err)
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, m.FS,
		goose.WithDisableGlobalRegistry(true),
		goose.WithTableName(m.VersionTable),
		goose.WithLocker(locker),
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

// retryLock reports whether a failure to take or give back the migration
// lock is worth another try: another migrator holds it (goose says so
// without a database error), or the database cannot answer now (it is
// starting, a connection broke). Any other database error fails the
// migration at once instead of after five minutes of retries: a pooler in
// transaction mode that mixes up prepared statements (08P01, 26000,
// 42P05), a missing privilege.
func retryLock(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return true
	}
	return pg.Code != "08P01" && dberr.IsUnavailable(err)
}

// createSchema runs SchemaCreate on a connection of sqlDB.
func createSchema(ctx context.Context, sqlDB *sql.DB) error {
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	defer conn.Close()
	err = conn.Raw(func(driverConn any) error {
		c, ok := driverConn.(*stdlib.Conn)
		if !ok {
			return fmt.Errorf("schema: the database/sql handle is not on the pgx driver (%T)", driverConn)
		}
		err := db.New().SchemaCreate(ctx, c.Conn())
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "23505" {
			// Two replicas created it at the same moment: IF NOT EXISTS
			// does not serialise them, and the loser's unique violation
			// says the schema is there.
			return nil
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("schema: create schema pglimit: %w", err)
	}
	return nil
}
