// Package schema holds pglimit's goose migrations and applies them.
//
// Every pglimit table lives in the schema pglimit, and so does goose's
// version table for pglimit (pglimit.goose_db_version) and its lock table
// (pglimit.goose_lock): pglimit never touches a table of the service it
// runs in, nor the service's own goose history. Most services call
// pglimit.Migrate, which calls Migrate here.
//
// Migrate is safe to call from every replica at once: goose's table locker
// lets one replica migrate while the others wait (a lock row, not a session
// advisory lock, so it also works through PgBouncer in transaction pooling
// mode), and a database that is already current is left alone.
package schema

import (
	"context"
	"database/sql"
	"embed"
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
)

//go:embed *.sql
var migrations embed.FS

// FS is the folder of pglimit's migrations, 00001_name.sql and so on, for a
// service that applies them with goose itself: create the schema pglimit
// first, and keep their history in VersionTable.
func FS() fs.FS { return migrations }

// Name is the PostgreSQL schema every pglimit table lives in.
const Name = "pglimit"

// VersionTable is the goose version table of pglimit's migrations.
const VersionTable = Name + ".goose_db_version"

// LockID is the row of the goose lock table that serialises concurrent
// migrators of pglimit's schema; it differs from goose's default so that a
// service's own migrations and pglimit's can run side by side.
const LockID = 0x70676c696d6974 // "pglimit"

// Migration is one folder of goose migrations and where goose keeps its
// history: pglimit's own (Pglimit), or a service's.
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

// Pglimit is pglimit's own schema.
func Pglimit() Migration {
	return Migration{FS: migrations, VersionTable: VersionTable, LockID: LockID}
}

// lockTable is the goose lock table beside m's version table.
func (m Migration) lockTable() string {
	if s, _, ok := strings.Cut(m.VersionTable, "."); ok {
		return s + ".goose_lock"
	}
	return "goose_lock"
}

// Migrate brings pool's database to pglimit's latest schema. It is safe to
// call concurrently from several replicas.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	return Apply(ctx, pool, Pglimit())
}

// Apply applies the migrations m on pool's database. It is what Migrate
// does for pglimit's schema; a service can use it for its own (cmd/studio
// does).
func Apply(ctx context.Context, pool *pgxpool.Pool, m Migration) error {
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	return ApplyDB(ctx, sqlDB, m)
}

// ApplyDB is Apply over a database/sql handle on the pgx driver (test
// harnesses have one).
func ApplyDB(ctx context.Context, sqlDB *sql.DB, m Migration) error {
	if m.FS == nil || m.VersionTable == "" || m.LockID <= 0 {
		return errors.New("schema: a migration needs an FS, a version table and a positive lock id")
	}
	if m.VersionTable == VersionTable {
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
		return fmt.Errorf("schema: create schema %s: %w", Name, err)
	}
	return nil
}
