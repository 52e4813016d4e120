package bus_test

import (
	"bytes"
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/pgbouncer"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// logs keeps what the bus logs.
type logs struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logs) Write(p []byte) (int, error) { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.Write(p) }
func (l *logs) String() string              { l.mu.Lock(); defer l.mu.Unlock(); return l.buf.String() }

// TestDeliversAndComesBack: a notification sent in a statement reaches
// the subscribers of its topic within a second (one key, or all keys); a
// listener whose backend is terminated is not Live until it has heard
// itself again, and comes back in a new epoch.
func TestDeliversAndComesBack(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	pgtest.Listen(t, pool)
	b := bus.For(pool)
	keys := make(chan string, 4)
	all := make(chan struct{}, 4)
	sub := b.Subscribe("test", func(k string) { keys <- k }, func() { all <- struct{}{} })
	defer sub.Close()
	ctx := context.Background()
	seq := sub.Seq()
	q := db.New()
	if err := q.BusNotify(ctx, pool, "test\na key"); err != nil {
		t.Fatal(err)
	}
	select {
	case k := <-keys:
		if k != "a key" {
			t.Fatalf("delivered %q", k)
		}
	case <-time.After(time.Second):
		t.Fatal("no delivery within a second")
	}
	if sub.Seq() == seq {
		t.Error("Seq did not move on a delivery")
	}
	if err := q.BusNotify(ctx, pool, "test"); err != nil {
		t.Fatal(err)
	}
	if err := q.BusNotify(ctx, pool, "other\nk"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-all:
	case <-time.After(time.Second):
		t.Fatal("no delivery of the whole topic within a second")
	}

	epoch := b.Epoch()
	// Only this test's database (each test has its own): the server may
	// be shared with other tests whose buses ping the same way.
	var terminated int
	if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND pid <> pg_backend_pid() AND query LIKE '%BusPing%'`).Scan(&terminated); err != nil {
		t.Fatal(err)
	}
	if terminated != 1 {
		t.Fatalf("terminated %d backends of the bus, want 1", terminated)
	}
	deadline := time.Now().Add(20 * time.Second)
	for b.Epoch() == epoch || !b.Live() {
		if time.Now().After(deadline) {
			t.Fatalf("the bus did not come back: live %v, epoch %d (was %d)", b.Live(), b.Epoch(), epoch)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if b.Epoch() < epoch+2 {
		t.Errorf("epoch %d after a reconnection, want at least %d (down, then up)", b.Epoch(), epoch+2)
	}
}

// TestTransactionPoolingIsNotLive: behind PgBouncer in transaction
// pooling a LISTEN is not kept, so the bus never turns Live, and it says
// so at INFO, not as a warning.
func TestTransactionPoolingIsNotLive(t *testing.T) {
	t.Parallel()
	upstream := pgtest.URL(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pb, err := pgbouncer.Start(ctx, upstream, pgbouncer.Options{PoolMode: pgbouncer.Transaction, PoolSize: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer pb.Stop()
	pool := pgtest.Pool(t, pgbouncer.WithParam(pb.URL(upstream), "default_query_exec_mode", "exec"), 4)
	var out logs
	log := slog.New(slog.NewTextHandler(&out, nil))
	runCtx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = bus.Run(runCtx, pool, log) }()
	// Keep the pooler's server connections busy with other clients.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); {
		if _, err := pool.Exec(ctx, "SELECT pg_sleep(0.01)"); err != nil {
			t.Fatal(err)
		}
		if bus.For(pool).Live() {
			t.Fatal("the bus turned live behind transaction pooling")
		}
	}
	stop()
	<-done
	if got := out.String(); !bytes.Contains([]byte(got), []byte("level=INFO")) || bytes.Contains([]byte(got), []byte("level=WARN")) {
		t.Errorf("want one INFO line and no warning; logged:\n%s", got)
	}
}
