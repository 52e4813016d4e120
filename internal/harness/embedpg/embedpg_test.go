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

// TestFreezeThaw freezes a cluster with a connection open: a statement on
// it and a new connection both hang (they end only by their own
// deadlines), and after Thaw the same connection answers again. A frozen
// cluster still stops.
func TestFreezeThaw(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
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
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	hangs := func(what string, f func(context.Context) error) {
		t.Helper()
		qctx, qcancel := context.WithTimeout(ctx, time.Second)
		defer qcancel()
		start := time.Now()
		err := f(qctx)
		if err == nil || time.Since(start) < 900*time.Millisecond {
			t.Errorf("%s on a frozen cluster: %v after %v, want a hang until the deadline", what, err, time.Since(start))
		}
	}
	hangs("a statement on an open connection", func(ctx context.Context) error {
		_, err := conn.Exec(ctx, `SELECT 1`)
		return err
	})
	hangs("a new connection", func(ctx context.Context) error {
		c2, err := pgx.Connect(ctx, c.URL("postgres"))
		if err == nil {
			c2.Close(context.Background())
		}
		return err
	})
	c.Thaw()
	conn2, err := pgx.Connect(ctx, c.URL("postgres"))
	if err != nil {
		t.Fatalf("after Thaw: %v", err)
	}
	defer conn2.Close(context.Background())
	var one int
	if err := conn2.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil || one != 1 {
		t.Fatalf("after Thaw: %d, %v", one, err)
	}
	if err := c.Freeze(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := c.Stop(); err != nil {
		t.Fatalf("Stop of a frozen cluster: %v", err)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("Stop of a frozen cluster took %v", took)
	}
}
