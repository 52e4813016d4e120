package schema_test

import (
	"context"
	"errors"
	"github.com/pglimit/pglimit"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/permit"
	"github.com/pglimit/pglimit/sql/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// TestLimitTablesAreUnlogged checks the ADR's premise: every table of the
// schema pglimit but goose's own is UNLOGGED (relpersistence 'u') and has
// an index on expires_at, but the two rewritten on every request
// (api_request_window, and slot, whose claims and releases rewrite a
// slot's row), which have none so that their rewrites are HOT updates; the
// kinds of slot are views of slot under the names the ADR gives them. Two
// tables hold no limit: slot_lock (the rows claims take turns on, UNLOGGED
// too, without expires_at) and bus_key (the bus's secret, logged: a key
// lost in a crash would leave the bus deaf). The calendar quotas' two
// tables carry period_end instead of expires_at, unindexed (every charge
// rewrites its key's row): quota_usage UNLOGGED, quota_ledger logged (a
// quota that bills survives a crash, and its charges commit with the
// caller's transaction). limit_override is an operator's configuration
// (package override), logged like bus_key, as is access_rule (the allow and deny lists:
// a crash does not lift a deny list).
func TestLimitTablesAreUnlogged(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	rows, err := pool.Query(context.Background(), `
		SELECT c.relname, c.relkind::text, c.relpersistence::text,
		       coalesce((SELECT p.relname FROM pg_inherits i JOIN pg_class p ON p.oid = i.inhparent WHERE i.inhrelid = c.oid), ''),
		       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
		               WHERE i.indrelid = c.oid AND a.attname = 'expires_at')
		FROM pg_class c
		WHERE c.relnamespace = 'pglimit'::regnamespace AND c.relkind IN ('r', 'p')
		  AND c.relname NOT LIKE 'goose%'
		ORDER BY c.relname`)
	if err != nil {
		t.Fatal(err)
	}
	type table struct {
		Name        string
		Kind        string
		Persistence string
		Parent      string
		Indexed     bool
	}
	var got []table
	for rows.Next() {
		var tb table
		if err := rows.Scan(&tb.Name, &tb.Kind, &tb.Persistence, &tb.Parent, &tb.Indexed); err != nil {
			t.Fatal(err)
		}
		got = append(got, tb)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	want := []table{
		{"access_rule", "r", "p", "", false}, // the allow and deny lists: configuration, logged
		{"api_request_window", "r", "u", "", false},
		{"ban", "r", "u", "", true},
		{"bus_key", "r", "p", "", false},
		{"limit_override", "r", "p", "", false},
		{"login_attempt", "r", "u", "", true},
		{"quota_ledger", "r", "p", "", false},
		{"quota_usage", "r", "u", "", false},
		{"refusal_minute", "r", "u", "", true},
		{"replica", "r", "u", "", true},
		{"share", "r", "u", "", true}, // the rate limit's shares: a row per share held
		{"slot", "r", "u", "", false},
		{"slot_lock", "r", "u", "", false},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("pglimit tables (-want +got):\n%s", diff)
	}
	var views []string
	vrows, err := pool.Query(context.Background(), `SELECT viewname FROM pg_views WHERE schemaname = 'pglimit' ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	views, err = pgx.CollectRows(vrows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"heavy_permit", "request_in_flight", "upload_window"}, views); diff != "" {
		t.Errorf("pglimit views (-want +got):\n%s", diff)
	}
}

// TestSlotTableKeepsLiveSlots migrates a database up to the partitioned
// slot table (version 3, its last), holds slots in it, and migrates on: the live
// slots are in pglimit.slot and its views, the lapsed ones are gone, and a
// held slot is still refused to a new claimer until a replica of the
// previous version releases it.
func TestSlotTableKeepsLiveSlots(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), 2)
	if _, err := pool.Exec(ctx, `CREATE SCHEMA IF NOT EXISTS pglimit`); err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, schema.FS(),
		goose.WithDisableGlobalRegistry(true), goose.WithTableName(schema.VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.UpTo(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `
		INSERT INTO pglimit.slot (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at) VALUES
		('heavy_permit', 'user:x:ann', 1, '00000000-0000-0000-0000-000000000001', 'ann', 'x', 'r', now(), now() + interval '1 hour'),
		('request_in_flight', 'token:t', 1, '00000000-0000-0000-0000-000000000002', 't', 'GET /', 'r', now(), now() - interval '1 minute'),
		('upload_window', 'upload:bo', 1, '00000000-0000-0000-0000-000000000003', 'bo', 'uploads', 'r', now(), now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate on: %v", err)
	}
	var all, heavy, inFlight, uploads int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM pglimit.slot), (SELECT count(*) FROM pglimit.heavy_permit),
		(SELECT count(*) FROM pglimit.request_in_flight), (SELECT count(*) FROM pglimit.upload_window)`).Scan(&all, &heavy, &inFlight, &uploads); err != nil {
		t.Fatal(err)
	}
	if all != 2 || heavy != 1 || inFlight != 0 || uploads != 1 {
		t.Fatalf("after the migration: %d slots, %d heavy, %d in flight, %d uploads; want 2, 1, 0, 1", all, heavy, inFlight, uploads)
	}
	l := permit.New(pool, permit.Options{Kind: permit.HeavyPermit})
	ann := permit.Claim{Scopes: []permit.Scope{{Key: "user:x:ann", Cap: 1}}, Holder: "ann", Endpoint: "x", Lease: time.Minute}
	if _, err := l.Claim(ctx, ann); !errors.Is(err, permit.ErrRefused) {
		t.Fatalf("claim of the slot held before the migration: %v, want refused", err)
	}
	// A replica of the previous version releases it (by lease id).
	if _, err := pool.Exec(ctx, `DELETE FROM pglimit.slot WHERE kind = 'heavy_permit' AND lease_id = '00000000-0000-0000-0000-000000000001'`); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Claim(ctx, ann); err != nil {
		t.Fatalf("claim after the old lease was released: %v", err)
	}
}

// TestHostTablesOfTheSameNames migrates into a database that already has
// tables public.replica, public.login_attempt and public.heavy_permit of
// another shape, as a service of its own may: pglimit migrates, works,
// and leaves the host's tables and rows as they were.
func TestHostTablesOfTheSameNames(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), 2)
	for _, stmt := range []string{
		`CREATE TABLE public.replica (id serial PRIMARY KEY, region text NOT NULL)`,
		`CREATE TABLE public.login_attempt (id bigserial PRIMARY KEY, email text, ok boolean)`,
		`CREATE TABLE public.heavy_permit (permit_no int PRIMARY KEY, note text)`,
		`INSERT INTO public.replica (region) VALUES ('eu-west'), ('us-east')`,
		`INSERT INTO public.login_attempt (email, ok) VALUES ('a@example.com', false)`,
		`INSERT INTO public.heavy_permit VALUES (7, 'the host''s own')`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	host := func() string {
		var s string
		if err := pool.QueryRow(ctx, `SELECT
			(SELECT string_agg(id || ':' || region, ',' ORDER BY id) FROM public.replica) || ' | ' ||
			(SELECT string_agg(id || ':' || email || ':' || ok, ',') FROM public.login_attempt) || ' | ' ||
			(SELECT string_agg(permit_no || ':' || note, ',') FROM public.heavy_permit) || ' | ' ||
			(SELECT string_agg(table_name || '.' || column_name, ',' ORDER BY table_name, ordinal_position)
			 FROM information_schema.columns WHERE table_schema = 'public')`).Scan(&s); err != nil {
			t.Fatal(err)
		}
		return s
	}
	before := host()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate beside the host's tables: %v", err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatalf("second migration: %v", err)
	}
	if after := host(); after != before {
		t.Fatalf("the host's tables changed:\nbefore %s\nafter  %s", before, after)
	}
	// pglimit works beside them.
	l := permit.New(pool, permit.Options{Kind: permit.HeavyPermit})
	lease, err := l.Claim(ctx, permit.Claim{Scopes: []permit.Scope{{Key: "user:x:alice", Cap: 1}}, Holder: "alice", Endpoint: "x", Lease: time.Minute})
	if err != nil {
		t.Fatalf("claim beside the host's tables: %v", err)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.heavy_permit`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("pglimit.heavy_permit holds %d rows (%v), want 1", n, err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if after := host(); after != before {
		t.Fatalf("the host's tables changed after a claim:\nbefore %s\nafter  %s", before, after)
	}
}

// TestLegacyTablesAreMovedForward: an installation migrated before pglimit
// had a schema of its own holds the limit tables in public beside
// public.pglimit_schema_version. Migrating drops them (their UNLOGGED
// contents go: limits restart from zero) and creates them in pglimit.
func TestLegacyTablesAreMovedForward(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.EmptyURL(t), 2)
	legacy, err := os.ReadFile("testdata/legacy.sql")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, string(legacy)); err != nil {
		t.Fatalf("legacy schema: %v", err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatalf("migrate a legacy installation: %v", err)
	}
	var public []string
	rows, err := pool.Query(ctx, `SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace AND relkind IN ('r', 'p') ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		public = append(public, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"unrelated"}, public); diff != "" {
		t.Fatalf("tables left in public (-want +got):\n%s", diff)
	}
	var slots int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.slot`).Scan(&slots); err != nil || slots != 0 {
		t.Fatalf("pglimit.slot: %d rows, %v", slots, err)
	}
}

// TestMigrateTwiceAndConcurrently migrates an already migrated database
// again, then from three goroutines (three replicas starting together):
// nothing fails and the version table records each migration once.
func TestMigrateTwiceAndConcurrently(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// A database with nothing in it: the template already holds the schema.
	url := pgtest.EmptyURL(t)
	pools := []*pgxpool.Pool{}
	for i := 0; i < 3; i++ {
		pools = append(pools, pgtest.Pool(t, url, 4))
	}
	var wg sync.WaitGroup
	errs := make([]error, len(pools))
	for i, p := range pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = pglimit.Migrate(ctx, p)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("migrator %d: %v", i, err)
		}
	}
	if err := pglimit.Migrate(ctx, pools[0]); err != nil {
		t.Fatalf("second migration: %v", err)
	}
	var applied, distinct int
	if err := pools[0].QueryRow(ctx, `SELECT count(*), count(DISTINCT version_id) FROM `+schema.VersionTable+` WHERE version_id > 0`).Scan(&applied, &distinct); err != nil {
		t.Fatal(err)
	}
	if applied != distinct || applied == 0 {
		t.Fatalf("version table: %d rows for %d migrations", applied, distinct)
	}
}

// TestDownAndUpAgain applies every Down section, checks the limit tables are
// gone, and migrates up again.
func TestDownAndUpAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.EmptyURL(t)
	pool := pgtest.Pool(t, url, 2)
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatal(err)
	}
	sqlDB := stdlib.OpenDBFromPool(pool)
	defer sqlDB.Close()
	provider, err := goose.NewProvider(goose.DialectPostgres, sqlDB, schema.FS(),
		goose.WithDisableGlobalRegistry(true), goose.WithTableName(schema.VersionTable))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := provider.DownTo(ctx, 0); err != nil {
		t.Fatalf("down: %v", err)
	}
	var tables int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relnamespace = 'pglimit'::regnamespace AND relname IN ('slot','heavy_permit','login_attempt','upload_window','request_in_flight','replica')`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Fatalf("%d limit tables left after migrating down", tables)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil {
		t.Fatalf("up again: %v", err)
	}
}
