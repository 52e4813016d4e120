package citustest

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClusterStarts starts a coordinator and two workers and checks that
// the coordinator sees both workers active, and that a distributed table
// created on it places its shards on both.
func TestClusterStarts(t *testing.T) {
	if ok, line := Installed(); !ok {
		t.Skip(line)
	}
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })

	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var workers int
	if err := conn.QueryRow(ctx, `SELECT count(*) FROM citus_get_active_worker_nodes()`).Scan(&workers); err != nil {
		t.Fatal(err)
	}
	if workers != 2 {
		t.Fatalf("citus_get_active_worker_nodes() returned %d rows, want 2", workers)
	}
	if _, err := conn.Exec(ctx, `CREATE UNLOGGED TABLE t (k text PRIMARY KEY);
		SELECT create_distributed_table('t', 'k')`); err != nil {
		t.Fatal(err)
	}
	var nodes int
	if err := conn.QueryRow(ctx, `SELECT count(DISTINCT nodeport) FROM citus_shards WHERE table_name = 't'::regclass`).Scan(&nodes); err != nil {
		t.Fatal(err)
	}
	if nodes != 2 {
		t.Fatalf("the shards of a distributed table are on %d nodes, want 2", nodes)
	}
	if len(c.WorkerURLs("postgres")) != 2 {
		t.Fatalf("WorkerURLs: %v", c.WorkerURLs("postgres"))
	}
}

// TestInstalledSaysWhere checks that the one line names citus.so either
// way.
func TestInstalledSaysWhere(t *testing.T) {
	_, line := Installed()
	if line == "" {
		t.Fatal("Installed returned no line")
	}
	t.Log(line)
}
