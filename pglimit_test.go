package pglimit_test

import (
	"context"
	"testing"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// TestMigrate migrates an empty database into the schema pglimit, twice:
// the second call finds it current and changes nothing.
func TestMigrate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), 4)
	ctx := context.Background()
	for i := range 2 {
		if err := pglimit.Migrate(ctx, pool); err != nil {
			t.Fatalf("migrate %d: %v", i+1, err)
		}
	}
	var tables []string
	rows, err := pool.Query(ctx, `SELECT table_name::text FROM information_schema.tables
		WHERE table_schema = 'pglimit' AND table_name IN ('heavy_permit', 'request_in_flight', 'upload_window', 'login_attempt', 'replica')
		ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var s string
		if err := rows.Scan(&s); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, s)
	}
	if len(tables) != 5 {
		t.Errorf("tables in schema pglimit: %v, want the five limit tables", tables)
	}
	var public int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM information_schema.tables WHERE table_schema = 'public'`).Scan(&public); err != nil {
		t.Fatal(err)
	}
	if public != 0 {
		t.Errorf("%d tables in schema public after Migrate, want none", public)
	}
}
