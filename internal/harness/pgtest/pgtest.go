// Package pgtest gives every test a real, isolated PostgreSQL database: a
// template database migrated once per set of migrations and cloned for each
// test (CREATE DATABASE ... TEMPLATE, as peterldowns/pgtestdb does), dropped
// when the test passes and kept for inspection when it fails.
//
// The server comes from, in this order:
//  1. TEST_DATABASE_URL or DATABASE_URL (package pgtestdocker, a module of
//     its own, sets it to a container it starts);
//  2. a throwaway cluster started from the PostgreSQL binaries installed on
//     the machine (internal/harness/embedpg), one per test binary.
//
// Whose databases they are depends on the role of that URL:
//   - a superuser: the tests' databases belong to, and the tests connect as,
//     the role pglimit_test (LOGIN, no other attribute, created on first use),
//     so a test runs with the rights a service has, not a superuser's. It is
//     made a member of pg_read_all_stats, so an observer of pg_stat_activity
//     (internal/harness/activity) reads the statements of every role in the test's
//     database.
//   - any other role: it must have LOGIN and CREATEDB; the tests' databases
//     belong to it and the tests connect as it.
//
// A test's database accepts connections from its owner (and superusers)
// only: roles belong to the whole server, and one made there before (a
// studio_console that can log in, from a superuser's migration) would
// otherwise take part in the tests, as a role whose statements the tests'
// role may not read. An observer that cannot read every session of its
// database fails the test saying so (internal/harness/activity).
//
// pgtestdb itself is not used: it marks its template with an UPDATE of
// pg_database, which only a superuser may run, and makes its own role,
// which needs CREATEROLE. A template here is built under a name of its own
// and renamed into place when migrated, which its owner may do.
//
// When no server is possible the test fails with one sentence saying what to
// install or grant; it never skips.
//
// A package whose tests use pgtest has a TestMain that calls Main, so the
// throwaway cluster is stopped and removed when the tests end.
package pgtest

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/internal/migrate"
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

func (m Migration) migration() migrate.Migration {
	return migrate.Migration{FS: m.FS, VersionTable: m.Table, LockID: m.LockID}
}

// TestRole is the role that owns the tests' databases when the server's URL
// is a superuser's.
const TestRole = "pglimit_test"

// testRolePassword lets TestRole log in where the server asks for a
// password; it guards nothing but throwaway test databases.
const testRolePassword = "pglimit_test"

// server is the server the tests use and how they use it.
type server struct {
	url   string        // as found (a database on the server, not a test's)
	admin *pgxpool.Pool // on url: creates and drops the tests' databases
	// role owns the tests' databases and is whom the tests connect as.
	role, password string

	mu        sync.Mutex
	templates map[string]*template
}

type template struct {
	once sync.Once
	err  error
}

var (
	serverOnce sync.Once
	srv        *server
	serverErr  error
	stopServer func()
)

// Main runs the tests and then after, in order, and stops the throwaway
// server, if one was started. Call it from TestMain. On a shared server
// (TEST_DATABASE_URL, DATABASE_URL) the tests run in a turn of their own
// (see takeTurn).
func Main(m *testing.M, after ...func()) { run(m, turnShared, after) }

// MainAlone is Main for a package whose tests open about as many
// connections as a server takes (the load check: three replicas and their
// full pools): on a shared server they run when no other test binary does,
// and the others wait while they run.
func MainAlone(m *testing.M, after ...func()) { run(m, turnAlone, after) }

// MainWithoutTurn is Main without a turn: the public test kit's Main, for
// an adopter's tests, whose connections are theirs to count.
func MainWithoutTurn(m *testing.M, after ...func()) { run(m, turnNone, after) }

func run(m *testing.M, turn turnKind, after []func()) {
	endTurn := takeTurn(turn)
	code := m.Run()
	for _, f := range after {
		f()
	}
	if srv != nil {
		srv.admin.Close()
	}
	if stopServer != nil {
		stopServer()
	}
	endTurn()
	os.Exit(code)
}

// ServerURL returns the URL of a database on the server tests use (not a
// per-test database), as its role (a superuser, or the DATABASE_URL's
// role). It fails t when no server can be had.
func ServerURL(t TB) string {
	t.Helper()
	return theServer(t).url
}

func theServer(t TB) *server {
	t.Helper()
	serverOnce.Do(func() {
		var u string
		u, serverErr = findServer()
		if serverErr == nil {
			srv, serverErr = connect(u)
		}
	})
	if serverErr != nil {
		t.Fatalf("pgtest: no PostgreSQL for the tests: %v", serverErr)
	}
	return srv
}

func findServer() (string, error) {
	if u := sharedServerURL(); u != "" {
		return u, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := embedpg.Start(ctx, embedpg.Options{})
	if err != nil {
		if errors.Is(err, embedpg.ErrNoBinaries) {
			return "", errors.New("set TEST_DATABASE_URL or DATABASE_URL to a PostgreSQL server, install the PostgreSQL server binaries (Debian: apt-get install postgresql), or, with Docker, run the tests through github.com/pglimit/pglimit/pgtestdocker")
		}
		return "", err
	}
	stopServer = func() { _ = c.Stop() }
	return c.URL("postgres"), nil
}

// connect opens the admin pool on u and decides whose the tests' databases
// are (see the package comment).
func connect(u string) (*server, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 4
	admin, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	s := &server{url: u, admin: admin, templates: map[string]*template{}}
	var super, createDB bool
	err = admin.QueryRow(ctx, `SELECT current_user, rolsuper, rolcreatedb FROM pg_roles WHERE rolname = current_user`).
		Scan(&s.role, &super, &createDB)
	if err != nil {
		admin.Close()
		return nil, fmt.Errorf("%s: %w", redact(u), err)
	}
	switch {
	case super:
		s.role, s.password = TestRole, testRolePassword
		err = s.withLock(ctx, "pgtest role", func(conn *pgxpool.Conn) error { return ensureTestRole(ctx, conn) })
	case createDB:
		s.password = cfg.ConnConfig.Password
	default:
		err = fmt.Errorf("the role %q of %s may not create databases: the tests need a superuser, or a role with LOGIN and CREATEDB (ALTER ROLE %s CREATEDB)",
			s.role, redact(u), pgx.Identifier{s.role}.Sanitize())
	}
	if err != nil {
		admin.Close()
		return nil, err
	}
	return s, nil
}

// ensureTestRole creates TestRole when it is missing and makes it a member
// of pg_read_all_stats, so observers read every role's statements.
func ensureTestRole(ctx context.Context, conn *pgxpool.Conn) error {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_roles WHERE rolname = $1)`, TestRole).Scan(&exists); err != nil {
		return err
	}
	// DDL: names and the password cannot be parameters.
	if !exists {
		if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD '%s' NOSUPERUSER NOCREATEDB NOCREATEROLE`,
			pgx.Identifier{TestRole}.Sanitize(), testRolePassword)); err != nil {
			return fmt.Errorf("create role %s: %w", TestRole, err)
		}
	}
	var member bool
	if err := conn.QueryRow(ctx, `SELECT pg_has_role($1, 'pg_read_all_stats', 'USAGE')`, TestRole).Scan(&member); err != nil {
		return err
	}
	if !member {
		if _, err := conn.Exec(ctx, `GRANT pg_read_all_stats TO `+pgx.Identifier{TestRole}.Sanitize()); err != nil {
			return fmt.Errorf("grant pg_read_all_stats to %s: %w", TestRole, err)
		}
	}
	return nil
}

// withLock runs f on an admin connection holding a session advisory lock
// named name, so test binaries running at once on one server (go test runs
// packages in parallel) do one thing at a time.
func (s *server) withLock(ctx context.Context, name string, f func(*pgxpool.Conn) error) error {
	conn, err := s.admin.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended($1, 0))`, name); err != nil {
		return err
	}
	defer func() {
		if _, err := conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtextextended($1, 0))`, name); err != nil {
			conn.Conn().Close(context.Background()) // a session lock goes with its session
		}
	}()
	return f(conn)
}

// hash names the template of a list of migrations for a role.
func hash(role string, migrations []Migration) (string, error) {
	h := sha256.New()
	fmt.Fprintf(h, "role %s\n", role)
	for _, mig := range migrations {
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

// template makes sure the template database name exists, migrated with
// migrations: once per process, and under a lock across processes. It is
// built as name_wip and renamed to name when complete, so a build that died
// half-way is never cloned (it is dropped by the next build).
func (s *server) template(name string, migrations []Migration) error {
	s.mu.Lock()
	tpl, ok := s.templates[name]
	if !ok {
		tpl = &template{}
		s.templates[name] = tpl
	}
	s.mu.Unlock()
	tpl.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		tpl.err = s.withLock(ctx, "pgtest template "+name, func(conn *pgxpool.Conn) error {
			var exists bool
			if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)`, name).Scan(&exists); err != nil {
				return err
			}
			if exists {
				return nil
			}
			wip := pgx.Identifier{name + "_wip"}.Sanitize()
			if _, err := conn.Exec(ctx, `DROP DATABASE IF EXISTS `+wip+` WITH (FORCE)`); err != nil {
				return err
			}
			if _, err := conn.Exec(ctx, `CREATE DATABASE `+wip+` OWNER `+pgx.Identifier{s.role}.Sanitize()); err != nil {
				return err
			}
			pool, err := pgxpool.New(ctx, s.databaseURL(name+"_wip"))
			if err != nil {
				return err
			}
			for _, m := range migrations {
				if err = migrate.Apply(ctx, pool, m.migration()); err != nil {
					break
				}
			}
			pool.Close()
			if err != nil {
				return fmt.Errorf("migrate template %s: %w", name, err)
			}
			_, err = conn.Exec(ctx, `ALTER DATABASE `+wip+` RENAME TO `+pgx.Identifier{name}.Sanitize())
			return err
		})
	})
	if tpl.err != nil {
		return fmt.Errorf("template %s: %w", name, tpl.err)
	}
	return nil
}

// URL returns the URL of a fresh database for this test, migrated with
// pglimit's schema and then migrations, in order. The database is dropped
// when the test passes and kept for inspection when it fails.
func URL(t TB, migrations ...Migration) string {
	t.Helper()
	s := theServer(t)
	all := append([]Migration{Limits()}, migrations...)
	h, err := hash(s.role, all)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	tpl := "pglimit_tpl_" + h
	if err := s.template(tpl, all); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	return s.newDatabase(t, "pglimit_test_"+h+"_", tpl)
}

// newDatabase creates a database named prefix plus a random suffix, owned by
// the tests' role and cloned from template ("" for an empty one), and
// drops it when the test passes.
func (s *server) newDatabase(t TB, prefix, template string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var suffix [4]byte
	_, _ = rand.Read(suffix[:])
	name := prefix + hex.EncodeToString(suffix[:])
	stmt := `CREATE DATABASE ` + pgx.Identifier{name}.Sanitize() + ` OWNER ` + pgx.Identifier{s.role}.Sanitize()
	if template != "" {
		stmt += ` TEMPLATE ` + pgx.Identifier{template}.Sanitize()
	}
	if _, err := s.admin.Exec(ctx, stmt); err != nil {
		t.Fatalf("pgtest: create database %s: %v", name, err)
	}
	// Roles belong to the whole server: one made there before (a
	// studio_console that may log in, from a superuser's `make run`) must
	// not take part in a test. Only the tests' role (and superusers) may
	// connect, so a test runs the same on every server.
	if _, err := s.admin.Exec(ctx, `REVOKE CONNECT, TEMPORARY ON DATABASE `+pgx.Identifier{name}.Sanitize()+` FROM PUBLIC`); err != nil {
		t.Fatalf("pgtest: %s: %v", name, err)
	}
	u := s.databaseURL(name)
	t.Logf("pgtest: database %s", redact(u))
	t.Cleanup(func() {
		if t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		// FORCE: a test that kills a replica leaves its connections behind
		// on purpose; drop the database anyway.
		if _, err := s.admin.Exec(ctx, `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`); err != nil {
			t.Fatalf("pgtest: drop database %s: %v", name, err)
		}
	})
	return u
}

// databaseURL is the URL of database name on the server, as the tests'
// role; everything else (host, port, TLS and other parameters) is the
// server URL's.
func (s *server) databaseURL(name string) string {
	return withLogin(s.url, s.role, s.password, name)
}

// withLogin returns server (a URL or a key/value connection string) with
// its user, password and database replaced.
func withLogin(server, user, password, database string) string {
	parsed, err := url.Parse(server)
	if err == nil && (parsed.Scheme == "postgres" || parsed.Scheme == "postgresql") {
		if password != "" {
			parsed.User = url.UserPassword(user, password)
		} else {
			parsed.User = url.User(user)
		}
		parsed.Path = "/" + database
		return parsed.String()
	}
	// key=value: a later setting overrides an earlier one.
	quote := func(v string) string {
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(v) + "'"
	}
	return server + " user=" + quote(user) + " password=" + quote(password) + " dbname=" + quote(database)
}

// redact hides the password of a connection URL for messages.
func redact(u string) string {
	parsed, err := url.Parse(u)
	if err != nil || parsed.Scheme == "" {
		return "the server's connection string"
	}
	return parsed.Redacted()
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
	for _, m := range append([]Migration{Limits()}, migrations...) {
		if err := migrate.Apply(ctx, app, m.migration()); err != nil {
			t.Fatalf("pgtest: migrate: %v", err)
		}
	}
	var err error
	replica, err = primary.StartReplica(ctx)
	if err != nil {
		t.Fatalf("pgtest: replica: %v", err)
	}
	t.Cleanup(func() { _ = replica.Stop() })
	return primary, replica
}

// EmptyURL returns the URL of a new, empty database (no schema) for this
// test, owned by the tests' role, dropped when the test passes.
func EmptyURL(t TB) string {
	t.Helper()
	return theServer(t).newDatabase(t, "pglimit_empty_", "")
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

// Listen runs the invalidation bus of each pool (internal/bus, as
// pglimit.Run runs it in a service) until the test ends, and waits until
// every one is Live: the limiters on those pools then answer refusals from
// memory.
func Listen(t TB, pools ...*pgxpool.Pool) {
	t.Helper()
	stop, err := RunBuses(context.Background(), nil, pools...)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	t.Cleanup(stop)
}

// RunBuses runs the invalidation bus of each pool, as pglimit.Run runs it,
// and returns once every one is Live, with the function that stops them
// and waits until they have; log receives the buses' failures (nil:
// slog.Default()). It fails when a bus is not Live within 30s or ctx ends
// first, with the buses stopped.
func RunBuses(ctx context.Context, log *slog.Logger, pools ...*pgxpool.Pool) (stop func(), err error) {
	busCtx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, pool := range pools {
		wg.Go(func() { _ = bus.Run(busCtx, pool, log) })
	}
	stop = func() { cancel(); wg.Wait() }
	deadline := time.Now().Add(30 * time.Second)
	for _, pool := range pools {
		for !bus.For(pool).Live() {
			if time.Now().After(deadline) || ctx.Err() != nil {
				stop()
				return nil, errors.New("the invalidation bus did not turn live within 30s")
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	return stop, nil
}

// TableActivity is what the database's statistics say was done to one of
// pglimit's tables (pg_stat_user_tables): an observer independent of the
// code under test. Writes are rows inserted and updated; IndexScans the
// scans of its indexes (every statement that finds a key's row by its
// primary key, an ON CONFLICT's check included).
type TableActivity struct{ Writes, IndexScans int64 }

// Activity closes pools (a backend hands its counts to the statistics
// when it exits) and returns table's activity in the database of url once
// the counts have stopped moving.
func Activity(t TB, url, table string, pools ...*pgxpool.Pool) TableActivity {
	t.Helper()
	for _, p := range pools {
		p.Close()
	}
	obs := Pool(t, url, 1)
	var last TableActivity
	stable := 0
	deadline := time.Now().Add(20 * time.Second)
	for first := true; time.Now().Before(deadline); first = false {
		var a TableActivity
		if err := obs.QueryRow(context.Background(), `SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0)::bigint,
			coalesce(sum(idx_scan), 0)::bigint
			FROM pg_stat_user_tables WHERE schemaname = 'pglimit' AND relname = $1`, table).Scan(&a.Writes, &a.IndexScans); err != nil {
			t.Fatalf("pgtest: activity: %v", err)
		}
		if !first && a == last {
			if stable++; stable == 3 {
				return a
			}
		} else {
			stable = 0
		}
		last = a
		time.Sleep(300 * time.Millisecond)
	}
	t.Fatalf("pgtest: the statistics of %s did not settle within 20s (last %+v)", table, last)
	return last
}
