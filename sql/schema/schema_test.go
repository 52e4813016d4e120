package schema_test

import (
	"context"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/sql/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLimitTablesAreUnlogged checks the ADR's premise: every limit table is
// UNLOGGED (relpersistence 'u') and has an index on expires_at.
func TestLimitTablesAreUnlogged(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname, c.relpersistence::text,
		       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = c.oid AND a.attname = 'expires_at')
		FROM pg_class c
		WHERE c.relname IN ('heavy_permit','login_attempt','upload_window','request_in_flight','replica') AND c.relkind = 'r'
		ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	type table struct {
		Name        string
		Persistence string
		Indexed     bool
	}
	var got []table
	for rows.Next() {
		var tb table
		if err := rows.Scan(&tb.Name, &tb.Persistence, &tb.Indexed); err != nil {
			t.Fatal(err)
		}
		got = append(got, tb)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []table{
		{"heavy_permit", "u", true},
		{"login_attempt", "u", true},
		{"replica", "u", true},
		{"request_in_flight", "u", true},
		{"upload_window", "u", true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("limit tables (-want +got):\n%s", diff)
	}
}

// TestMigrateTwiceAndConcurrently migrates an already migrated database
// again, then from three goroutines (three replicas starting together):
// nothing fails and the version table records each migration once.
func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A database with nothing in it: the template already holds the schema.
	url := pgtest.EmptyURL(t)
	pools := []*pgxpool.Pool{}
	for i := 0; i < 3; i++ {
		pools = append(pools, pgtest.Pool(t, url, 4))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pools))
	for i, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = schema.Migrate(ctx, p)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
	if err := schema.Migrate(ctx, pools[0]); err != nil {
		t.Fatalf("second migration: %v", err)
	}
	var applied, distinct int
	if err := pools[0].QueryRow(ctx, `SELECT count(*), count(DISTINCT version_id) FROM `+schema.VersionTable+` WHERE version_id > 0`).Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied != distinct || applied == 0 {
		t.Fatalf("version table: %d rows for %d migrations", applied, distinct)
	}
}

// TestDownAndUpAgain applies every Down section, checks the limit tables are
// gone, and migrates up again.
func TestDownAndUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyURL(t)
	pool := pgtest.Pool(t, url, 2)
	if err := schema.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, schema.FS(),
		goose.WithDisableGlobalRegistry(true), goose.WithTableName(schema.VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname IN ('heavy_permit','login_attempt','upload_window','request_in_flight','replica')`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d limit tables left after migrating down", tables)
	}
	if err := schema.Migrate(ctx, pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
