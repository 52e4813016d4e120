// Package schema holds pglimit's goose migrations and applies them.
//
// What it guarantees: every pglimit table lives in the PostgreSQL schema
// pglimit, and so do goose's version table for pglimit's migrations
// (pglimit.goose_db_version, VersionTable) and its lock table
// (pglimit.goose_lock): pglimit never touches a table of the service it
// runs in, nor the service's own goose history, and a service may have
// tables of the same names in its own schemas. Migrate is safe to call from
// every replica at once: one replica migrates while the others wait, and a
// database that is already current is left alone. Most services call
// pglimit.Migrate, which calls Migrate here.
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
// LockID. On Citus it then calls Migrate as well, which finds the
// migrations applied and distributes the limit tables.
package schema

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/migrate"
)

//go:embed *.sql
var migrations embed.FS

// FS is the folder of pglimit's migrations, 00001_name.sql and so on, for a
// service that applies them with goose itself.
func FS() fs.FS { return migrations }

// VersionTable is the goose version table of pglimit's migrations.
const VersionTable = "pglimit.goose_db_version"

// LockID is the row of the goose lock table (pglimit.goose_lock) that
// serialises concurrent migrators of pglimit's schema; it differs from
// goose's default so that a service's own migrations and pglimit's can run
// side by side.
const LockID = 0x70676c696d6974 // "pglimit"

// Migrate brings pool's database to pglimit's latest schema. It is safe to
// call concurrently from several replicas. On a Citus coordinator (the
// extension citus installed in the database) it then distributes the limit
// tables, colocated, by the column each decision names (citus/distribute.sql),
// and logs how they are placed.
func Migrate(ctx context.Context, pool *pgxpool.Pool) error {
	if err := migrate.Apply(ctx, pool, migrate.Migration{FS: migrations, VersionTable: VersionTable, LockID: LockID}); err != nil {
		return err
	}
	return distribute(ctx, pool)
}

//go:embed citus/distribute.sql
var distributeSQL string

// distribute runs citus/distribute.sql (a no-op without Citus) and logs
// the placement of pglimit's tables on Citus.
func distribute(ctx context.Context, pool *pgxpool.Pool) error {
	// SQL in Go: this file and the catalog read below name Citus' own
	// functions and catalogs, which exist only where Citus is installed,
	// so sqlc (which prepares every query on a plain PostgreSQL) cannot
	// compile them.
	var citus bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_extension WHERE extname = 'citus')`).Scan(&citus); err != nil {
		return fmt.Errorf("schema: citus: %w", err)
	}
	if !citus {
		return nil
	}
	if _, err := pool.Exec(ctx, distributeSQL); err != nil {
		return fmt.Errorf("schema: distribute on citus: %w", err)
	}
	rows, err := pool.Query(ctx, `SELECT p.logicalrelid::text, column_to_column_name(p.logicalrelid, p.partkey),
		       (SELECT count(*) FROM pg_dist_shard s WHERE s.logicalrelid = p.logicalrelid)
		FROM pg_dist_partition AS p
		WHERE p.logicalrelid::text LIKE 'pglimit.%'
		ORDER BY 1`)
	if err != nil {
		return fmt.Errorf("schema: citus placement: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var table, column string
		var shards int64
		if err := rows.Scan(&table, &column, &shards); err != nil {
			return fmt.Errorf("schema: citus placement: %w", err)
		}
		slog.InfoContext(ctx, "pglimit: on citus, distributed by its key", "table", table, "column", column, "shards", shards)
	}
	return rows.Err()
}
