// Package pgtest gives every test a real, isolated PostgreSQL database: a
// template database migrated once per schema and cloned for each test
// (peterldowns/pgtestdb), dropped when the test passes.
//
// The server comes from, in this order:
//  1. TEST_DATABASE_URL or DATABASE_URL;
//  2. testcontainers-go's postgres module, when a Docker daemon answers;
//  3. a throwaway cluster started from the PostgreSQL binaries installed on
//     the machine (internal/embedpg), one per test binary.
//
// When none is possible the test fails with one sentence saying what to
// install; it never skips.
//
// A package whose tests use pgtest has a TestMain that calls Main, so the
// throwaway cluster is stopped and removed when the tests end.
package pgtest

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/url"
	"os"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver pgtestdb opens
	"github.com/peterldowns/pgtestdb"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pglimit/pglimit/internal/embedpg"
	"github.com/pglimit/pglimit/sql/schema"
)

// TB is the part of testing.TB pgtest uses; *testing.T, *testing.B and
// *testing.F have it, and so does the stand-in ForExample uses.
type TB interface {
	Cleanup(func())
	Failed() bool
	Fatalf(format string, args ...any)
	Helper()
	Logf(format string, args ...any)
}

// Migration is one goose migration folder to apply to a test database.
type Migration struct {
	// FS holds the NNNNN_name.sql files.
	FS fs.FS
	// Table is the goose version table for this folder.
	Table string
	// LockID is the advisory lock held while migrating.
	LockID int64
}

// Limits is pglimit's own schema.
func Limits() Migration {
	return Migration{FS: schema.FS(), Table: schema.VersionTable, LockID: schema.LockID}
}

func (m Migration) schema() schema.Migration {
	return schema.Migration{FS: m.FS, VersionTable: m.Table, LockID: m.LockID}
}

var (
	serverOnce sync.Once
	serverURL  string
	serverErr  error
	stopServer func()
)

// Main runs the tests and then stops the throwaway server, if one was
// started. Call it from TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if stopServer != nil {
		stopServer()
	}
	os.Exit(code)
}

// ServerURL returns the URL of a database on the server tests use (not a
// per-test database). It fails t when no server can be had.
func ServerURL(t TB) string {
	t.Helper()
	serverOnce.Do(func() { serverURL, serverErr = findServer() })
	if serverErr != nil {
		t.Fatalf("pgtest: no PostgreSQL for the tests: %v", serverErr)
	}
	return serverURL
}

func findServer() (string, error) {
	for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(name); u != "" {
			return u, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if dockerAnswers() {
		c, err := tcpostgres.Run(ctx, "postgres:15-alpine",
			tcpostgres.WithDatabase("test"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
			tcpostgres.BasicWaitStrategies())
		if err == nil {
			u, err := c.ConnectionString(ctx, "sslmode=disable")
			if err == nil {
				stopServer = func() { _ = c.Terminate(context.Background()) }
				return u, nil
			}
		}
	}
	c, err := embedpg.Start(ctx, embedpg.Options{})
	if err != nil {
		if errors.Is(err, embedpg.ErrNoBinaries) {
			return "", errors.New("set DATABASE_URL to a PostgreSQL server, start a Docker daemon, or install the PostgreSQL server binaries (Debian: apt-get install postgresql)")
		}
		return "", err
	}
	stopServer = func() { _ = c.Stop() }
	return c.URL("postgres"), nil
}

// dockerAnswers reports whether a Docker daemon socket accepts connections,
// without waiting on testcontainers' own, slower probing.
func dockerAnswers() bool {
	addr := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		u, err := url.Parse(h)
		if err != nil || u.Scheme != "unix" {
			return err == nil // a TCP daemon: let testcontainers try
		}
		addr = u.Path
	}
	conn, err := net.DialTimeout("unix", addr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}

// migrator is pgtestdb's Migrator over goose folders.
type migrator []Migration

func (m migrator) Hash() (string, error) {
	h := sha256.New()
	for _, mig := range m {
		fmt.Fprintf(h, "table %s\n", mig.Table)
		names, err := fs.Glob(mig.FS, "*.sql")
		if err != nil {
			return "", err
		}
		sort.Strings(names)
		for _, n := range names {
			b, err := fs.ReadFile(mig.FS, n)
			if err != nil {
				return "", err
			}
			fmt.Fprintf(h, "%s %d\n", n, len(b))
			h.Write(b)
		}
	}
	return hex.EncodeToString(h.Sum(nil))[:16], nil
}

func (m migrator) Migrate(ctx context.Context, db *sql.DB, _ pgtestdb.Config) error {
	for _, mig := range m {
		if err := schema.ApplyDB(ctx, db, mig.schema()); err != nil {
			return err
		}
	}
	return nil
}

// URL returns the URL of a fresh database for this test, migrated with
// pglimit's schema and then migrations, in order. The database is dropped
// when the test passes and kept for inspection when it fails.
func URL(t TB, migrations ...Migration) string {
	t.Helper()
	server := ServerURL(t)
	conf, err := configOf(server)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return pgtestdb.Custom(t, conf, migrator(append([]Migration{Limits()}, migrations...))).URL()
}

func configOf(server string) (pgtestdb.Config, error) {
	cfg, err := pgxpool.ParseConfig(server)
	if err != nil {
		return pgtestdb.Config{}, err
	}
	cc := cfg.ConnConfig
	return pgtestdb.Config{
		DriverName: "pgx",
		Host:       cc.Host,
		Port:       fmt.Sprint(cc.Port),
		User:       cc.User,
		Password:   cc.Password,
		Database:   cc.Database,
		Options:    "sslmode=disable",
		// A test that kills a replica leaves its connections behind on
		// purpose; drop the database anyway.
		ForceTerminateConnections: true,
	}, nil
}

// Pool opens a pool of at most maxConns connections on url, closed when the
// test ends. Several pools on one URL stand in for several replicas.
func Pool(t TB, url string, maxConns int32) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	cfg.MaxConns = maxConns
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// NewDB is URL followed by Pool: a fresh migrated database and a pool of
// maxConns on it.
func NewDB(t TB, maxConns int32, migrations ...Migration) (*pgxpool.Pool, string) {
	t.Helper()
	u := URL(t, migrations...)
	return Pool(t, u, maxConns), u
}

// Cluster starts a throwaway cluster of this test's own (whatever the
// server of the other tests is), for tests that stop, crash or replicate a
// server. It is stopped and removed when the test ends.
func Cluster(t TB) *embedpg.Cluster {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := embedpg.Start(ctx, embedpg.Options{})
	if err != nil {
		t.Fatalf("pgtest: throwaway cluster: %v", err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c
}

// WithReplica starts a throwaway primary and a streaming read replica of it
// (pg_basebackup -R), creates database "app" on the primary, migrates it
// with pglimit's schema and migrations, and waits until the replica has
// it. Both are stopped and removed when the test ends.
func WithReplica(t TB, migrations ...Migration) (primary, replica *embedpg.Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	primary = Cluster(t)
	admin := Pool(t, primary.URL("postgres"), 2)
	if _, err := admin.Exec(ctx, `CREATE DATABASE app`); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	app := Pool(t, primary.URL("app"), 4)
	if err := (migrator(append([]Migration{Limits()}, migrations...))).migratePool(ctx, app); err != nil {
		t.Fatalf("pgtest: migrate: %v", err)
	}
	var err error
	replica, err = primary.StartReplica(ctx)
	if err != nil {
		t.Fatalf("pgtest: replica: %v", err)
	}
	t.Cleanup(func() { _ = replica.Stop() })
	return primary, replica
}

func (m migrator) migratePool(ctx context.Context, pool *pgxpool.Pool) error {
	for _, mig := range m {
		if err := schema.Apply(ctx, pool, mig.schema()); err != nil {
			return err
		}
	}
	return nil
}

// EmptyURL returns the URL of a new, empty database (no schema) for this
// test, dropped when the test ends.
func EmptyURL(t TB) string {
	t.Helper()
	server := ServerURL(t)
	admin := Pool(t, server, 1)
	ctx := context.Background()
	name := fmt.Sprintf("pgtest_empty_%d_%d", os.Getpid(), time.Now().UnixNano())
	if _, err := admin.Exec(ctx, `CREATE DATABASE `+name); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), `DROP DATABASE IF EXISTS `+name+` WITH (FORCE)`)
	})
	return WithDatabase(server, name)
}

// WithDatabase returns url with its database name replaced by name.
func WithDatabase(u, name string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		return u
	}
	parsed.Path = "/" + name
	return parsed.String()
}

// ForExample returns a fresh migrated database for a runnable example
// (which has no testing.T) and the function that drops it. It panics when
// no server can be had.
func ForExample(migrations ...Migration) (url string, cleanup func()) {
	tb := &exampleTB{}
	url = URL(tb, migrations...)
	return url, tb.cleanup
}

type exampleTB struct {
	cleanups []func()
}

func (e *exampleTB) Cleanup(f func())                  { e.cleanups = append(e.cleanups, f) }
func (e *exampleTB) Failed() bool                      { return false }
func (e *exampleTB) Fatalf(format string, args ...any) { panic(fmt.Sprintf(format, args...)) }
func (e *exampleTB) Helper()                           {}
func (e *exampleTB) Logf(string, ...any)               {}
func (e *exampleTB) cleanup() {
	for i := len(e.cleanups) - 1; i >= 0; i-- {
		e.cleanups[i]()
	}
}
