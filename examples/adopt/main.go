// Command adopt is a small service as a team has it before pglimit — its
// own goose migrations (with tables named login_attempt and replica, as
// pglimit's are), its own sign-in, API tokens, an orders API and a usage
// report — that adopts pglimit with its public API only: the sign-in
// throttle on POST /login, a heavy-request limit on the usage report and an
// in-flight cap per API token around every route.
//
// Every line that adopting pglimit added or changed ends with a comment
// "pglimit:" and the part it belongs to (setup, signin, heavy, inflight).
// The README's "Adopting pglimit in your service" gives their count per
// part, and TestReadmeAdoptionLines keeps that count true.
//
// The service's own SQL is written inline, as many services have it:
// adopting pglimit asks nothing of how a service writes its own queries.
//
// Try it (-demo creates alice, bob, carol and dave, password "adopt"):
//
//	go run ./examples/adopt -database-url postgres://postgres@127.0.0.1:5432/test -demo
//	curl -s localhost:8090/login --json '{"username":"alice","password":"adopt"}'
//	curl -s localhost:8090/orders -H 'Authorization: Bearer <token>'
//	curl -s localhost:8090/reports/usage -H 'Authorization: Bearer <token>'
//
// Behind PgBouncer in transaction pooling mode the database URL needs
// default_query_exec_mode=exec (README, "Behind PgBouncer").
package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit" // pglimit:setup
)

// version is the service's version, as its replica table records it.
const version = "1.4.2"

//go:embed migrations/*.sql
var migrations embed.FS

func main() {
	addr := flag.String("addr", "127.0.0.1:8090", "listen address")
	databaseURL := flag.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL URL (default $DATABASE_URL)")
	name := flag.String("name", defaultName(), "this instance's name")
	demo := flag.Bool("demo", false, "create the users alice, bob, carol and dave (password \"adopt\"), three orders each")
	queryDelay := flag.Duration("query-delay", 0, "every /orders and /reports/usage request first waits this long in the database (tests hold requests in flight with it)")
	flag.Parse()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	slog.SetDefault(log)
	if err := run(*addr, *databaseURL, *name, *demo, *queryDelay, log); err != nil {
		log.Error("adopt: stopped", "err", err)
		os.Exit(1)
	}
}

func run(addr, databaseURL, name string, demo bool, queryDelay time.Duration, log *slog.Logger) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL)
	if err != nil {
		return err
	}
	defer pool.Close()
	if err := migrate(ctx, pool); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil { // pglimit:setup
		return fmt.Errorf("migrate pglimit: %w", err) // pglimit:setup
	} // pglimit:setup
	if _, err := pool.Exec(ctx, `INSERT INTO replica (name, version) VALUES ($1, $2)
		ON CONFLICT (name) DO UPDATE SET version = excluded.version, started_at = now()`, name, version); err != nil {
		return fmt.Errorf("register: %w", err)
	}
	if demo {
		if err := seed(ctx, pool); err != nil {
			return fmt.Errorf("demo data: %w", err)
		}
	}

	s := &service{pool: pool, log: log, queryDelay: queryDelay}
	handler, err := s.routes()
	if err != nil {
		return err
	}
	srv := &http.Server{Addr: addr, Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	ran := make(chan error, 1)                                                               // pglimit:setup
	go func() { ran <- pglimit.Run(ctx, pool, pglimit.RunOptions{Replica: name}); stop() }() // pglimit:setup
	log.Info("adopt: serving", "addr", addr, "name", name)
	err = srv.ListenAndServe()
	if errors.Is(err, http.ErrServerClosed) {
		err = nil
	}
	stop()                         // pglimit:setup
	return errors.Join(err, <-ran) // pglimit:setup
}

// migrate applies the service's own migrations with goose. The lock is a
// row of goose's lock table, not a session advisory lock, so instances that
// start together take turns — through PgBouncer in transaction pooling mode
// too, where a session lock would be taken and released on different
// server connections.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	fsys, err := fs.Sub(migrations, "migrations")
	if err != nil {
		return err
	}
	db := stdlib.OpenDBFromPool(pool)
	defer db.Close()
	locker, err := lock.NewPostgresTableLocker(lock.WithTableLockTimeout(500*time.Millisecond, 600))
	if err != nil {
		return err
	}
	provider, err := goose.NewProvider(goose.DialectPostgres, db, fsys,
		goose.WithDisableGlobalRegistry(true), goose.WithLocker(locker))
	if err != nil {
		return err
	}
	_, err = provider.Up(ctx)
	return err
}

// seed creates the demo users, each with three orders, once: instances
// that start together create them once between them.
func seed(ctx context.Context, pool *pgxpool.Pool) error {
	hash, err := bcrypt.GenerateFromPassword([]byte("adopt"), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	for _, user := range []string{"alice", "bob", "carol", "dave"} {
		_, err := pool.Exec(ctx, `WITH u AS (
				INSERT INTO app_user (username, password_hash) VALUES ($1, $2)
				ON CONFLICT (username) DO NOTHING RETURNING id)
			INSERT INTO orders (user_id, item, amount_cents)
			SELECT u.id, 'item ' || g, g * 1250 FROM u, generate_series(1, 3) AS g`, user, hash)
		if err != nil {
			return err
		}
	}
	return nil
}

// defaultName is host:pid.
func defaultName() string {
	host, err := os.Hostname()
	if err != nil {
		host = "localhost"
	}
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}
