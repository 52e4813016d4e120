package embedpg

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClusterLifecycle starts a throwaway cluster, crashes and restarts it,
// and checks that an UNLOGGED table comes back empty while a logged one
// keeps its row: the behaviour the limits rely on after a database crash.
func TestClusterLifecycle(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })

	exec := func(sql string) {
		t.Helper()
		conn, err := pgx.Connect(ctx, c.URL("postgres"))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := conn.Exec(ctx, sql); err != nil {
			t.Fatal(err)
		}
	}
	exec(`CREATE UNLOGGED TABLE u (x int); INSERT INTO u VALUES (1);
	      CREATE TABLE l (x int); INSERT INTO l VALUES (1); CHECKPOINT;`)
	port := c.Port
	if err := c.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Restart(ctx); err != nil {
		t.Fatal(err)
	}
	if c.Port != port {
		t.Fatalf("restart moved the port from %d to %d", port, c.Port)
	}
	conn, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var unlogged, logged int
	if err := conn.QueryRow(ctx, `SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM l)`).Scan(&unlogged, &logged); err != nil {
		t.Fatal(err)
	}
	if unlogged != 0 || logged != 1 {
		t.Fatalf("after a crash: unlogged rows %d (want 0), logged rows %d (want 1)", unlogged, logged)
	}
}

// TestReplicaStreams starts a streaming replica and sees a row written on
// the primary arrive on it.
func TestReplicaStreams(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary, err := Start(ctx, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = primary.Stop() })
	replica, err := primary.StartReplica(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = replica.Stop() })

	p, err := pgx.Connect(ctx, primary.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close(ctx)
	if _, err := p.Exec(ctx, `CREATE TABLE t (x int); INSERT INTO t VALUES (42)`); err != nil {
		t.Fatal(err)
	}
	r, err := pgx.Connect(ctx, replica.URL("postgres"))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(ctx)
	var inRecovery bool
	if err := r.QueryRow(ctx, `SELECT pg_is_in_recovery()`).Scan(&inRecovery); err != nil || !inRecovery {
		t.Fatalf("replica: in recovery %v, err %v", inRecovery, err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		var x int
		err := r.QueryRow(ctx, `SELECT x FROM t`).Scan(&x)
		if err == nil && x == 42 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("row never reached the replica: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
