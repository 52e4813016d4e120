package pgbouncer_test

import (
	"context"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/pgbouncer"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// connect opens a client connection through url (pgx's exec mode: no
// prepared statements, see the root package's TestPgBouncerExecModes).
func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), pgbouncer.WithParam(url, "default_query_exec_mode", "exec"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestTransactionPoolingSharesServerConnections shows what the pooler does:
// in transaction mode two clients are served by one server connection (pool
// size 1), so a session setting one client makes is seen by the other —
// the reason pglimit sets only transaction-local settings; in session mode
// each client has a server connection of its own.
func TestTransactionPoolingSharesServerConnections(t *testing.T) {
	t.Parallel()
	upstream := pgtest.EmptyURL(t)
	for _, tc := range []struct {
		mode       string
		samePID    bool
		leakedName string
	}{
		{pgbouncer.Transaction, true, "set-by-a"},
		{pgbouncer.Session, false, ""},
	} {
		t.Run(tc.mode, func(t *testing.T) {
			b := pgbouncer.ForTest(t, upstream, pgbouncer.Options{PoolMode: tc.mode, PoolSize: 2})
			if b.PoolMode != tc.mode || b.PoolSize != 2 {
				t.Fatalf("bouncer runs %s/%d, want %s/2", b.PoolMode, b.PoolSize, tc.mode)
			}
			a, c := connect(t, b.URL(upstream)), connect(t, b.URL(upstream))
			var pidA, pidC int
			if err := a.QueryRow(t.Context(), `SELECT pg_backend_pid()`).Scan(&pidA); err != nil {
				t.Fatal(err)
			}
			if _, err := a.Exec(t.Context(), `SET application_name = 'set-by-a'`); err != nil {
				t.Fatal(err)
			}
			var name string
			if err := c.QueryRow(t.Context(), `SELECT pg_backend_pid(), current_setting('application_name')`).Scan(&pidC, &name); err != nil {
				t.Fatal(err)
			}
			if (pidA == pidC) != tc.samePID {
				t.Errorf("server pids %d and %d: same = %v, want %v", pidA, pidC, pidA == pidC, tc.samePID)
			}
			if name != tc.leakedName {
				t.Errorf("the second client's application_name is %q, want %q", name, tc.leakedName)
			}
		})
	}
}

func TestStartRefusesBadOptions(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, upstream string
		opts           pgbouncer.Options
		want           string
	}{
		{"statement pooling", "postgres://u@127.0.0.1:5432/db", pgbouncer.Options{PoolMode: "statement"}, "pool mode"},
		{"negative pool size", "postgres://u@127.0.0.1:5432/db", pgbouncer.Options{PoolSize: -1}, "negative"},
		{"not a URL", "host=127.0.0.1 user=u", pgbouncer.Options{}, "postgres:// URL"},
		{"no user", "postgres://127.0.0.1:5432/db", pgbouncer.Options{}, "no user"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := pgbouncer.Start(t.Context(), tc.upstream, tc.opts)
			if err == nil {
				_ = b.Stop()
				t.Fatal("started")
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not say %q", err, tc.want)
			}
		})
	}
}

func TestURLAndWithParam(t *testing.T) {
	t.Parallel()
	b := &pgbouncer.Bouncer{Port: 6432}
	got := pgbouncer.WithParam(b.URL("postgres://u:p@db.example:5432/app?sslmode=disable"), "default_query_exec_mode", "exec")
	if want := "postgres://u:p@127.0.0.1:6432/app?default_query_exec_mode=exec&sslmode=disable"; got != want {
		t.Fatalf("got %s, want %s", got, want)
	}
}
