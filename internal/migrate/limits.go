package migrate

import (
	"context"
	"fmt"
	"io/fs"
	"log/slog"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/sql/schema"
)

// Limits brings pool's database to pglimit's latest schema (package
// sql/schema) and, on a Citus coordinator (the extension citus installed
// in the database), distributes the limit tables, colocated, by the
// column each decision names (citus/distribute.sql), and logs how they are
// placed. pglimit.Migrate is this. It is safe to call concurrently from
// several replicas.
func Limits(ctx context.Context, pool *pgxpool.Pool) error {
	if err := Apply(ctx, pool, Migration{FS: schema.FS(), VersionTable: schema.VersionTable, LockID: schema.LockID}); err != nil {
		return err
	}
	return distribute(ctx, pool)
}

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
	distributeSQL, err := fs.ReadFile(schema.FS(), "citus/distribute.sql")
	if err != nil {
		return fmt.Errorf("schema: distribute on citus: %w", err)
	}
	if _, err := pool.Exec(ctx, string(distributeSQL)); err != nil {
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
