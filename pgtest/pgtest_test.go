package pgtest_test

import (
	"context"
	"embed"
	"io/fs"
	"testing"

	"github.com/pglimit/pglimit/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

//go:embed testdata/migrations/*.sql
var files embed.FS

func orders(t *testing.T) pgtest.Migration {
	t.Helper()
	sub, err := fs.Sub(files, "testdata/migrations")
	if err != nil {
		t.Fatal(err)
	}
	return pgtest.Migration{FS: sub, Table: "orders_version", LockID: 7001}
}

// TestURL: each test's database is its own, migrated with pglimit's schema
// and then the caller's, and two pools on it see one another's writes.
func TestURL(t *testing.T) {
	ctx := context.Background()
	a, b := pgtest.URL(t, orders(t)), pgtest.URL(t, orders(t))
	if a == b {
		t.Fatalf("two calls gave one database: %s", a)
	}
	replica1, replica2 := pgtest.Pool(t, a, 2), pgtest.Pool(t, a, 2)
	for _, table := range []string{"pglimit.api_request_window", "pglimit.slot", "public.orders"} {
		var found bool
		if err := replica1.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, table).Scan(&found); err != nil || !found {
			t.Errorf("%s: found %v, err %v", table, found, err)
		}
	}
	if _, err := replica1.Exec(ctx, `INSERT INTO orders VALUES (1, 250)`); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := replica2.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 1 {
		t.Errorf("the second pool sees %d orders (err %v), want 1", n, err)
	}
	other := pgtest.Pool(t, b, 1)
	if err := other.QueryRow(ctx, `SELECT count(*) FROM orders`).Scan(&n); err != nil || n != 0 {
		t.Errorf("another test's database has %d orders (err %v), want 0", n, err)
	}
}
