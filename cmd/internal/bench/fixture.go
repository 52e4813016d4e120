package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// DefaultRows is the size of the page fixture: 2,000,000 rows.
const DefaultRows = 2_000_000

// Depths are the page depths measured (rows skipped before the page),
// those that fit in the fixture.
var Depths = []int{0, 10_000, 100_000, 1_000_000, 1_990_000}

// PageSize is the rows of one page.
const PageSize = 50

const (
	firstPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		ORDER BY occurred_at DESC, id DESC LIMIT $1`
	offsetPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		ORDER BY occurred_at DESC, id DESC LIMIT $1 OFFSET $2`
	keysetPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		WHERE (occurred_at, id) < ($1, $2)
		ORDER BY occurred_at DESC, id DESC LIMIT $3`
)

// BuildEvents makes bench_event(occurred_at, id, kind, payload) with rows
// rows, three to a timestamp (ties on occurred_at broken by id), indexed on
// (occurred_at, id) — the fixture of cursor/bench_test.go. It keeps a table
// that already has exactly rows rows, and replaces any other.
func BuildEvents(ctx context.Context, pool *pgxpool.Pool, rows int) (built bool, err error) {
	var n int64
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM bench_event`).Scan(&n); err == nil && n == int64(rows) {
		return false, nil
	}
	for _, stmt := range []string{
		`DROP TABLE IF EXISTS bench_event`,
		`CREATE TABLE bench_event (
			occurred_at timestamptz NOT NULL,
			id          bigint      NOT NULL,
			kind        text        NOT NULL,
			payload     text        NOT NULL)`,
		fmt.Sprintf(`INSERT INTO bench_event
			SELECT timestamptz '2026-01-01 00:00:00+00' + (g / 3) * interval '1 second' + (g %% 1000) * interval '1 microsecond',
			       g,
			       (ARRAY['audit', 'event', 'alert'])[g %% 3 + 1],
			       md5(g::text)
			FROM generate_series(1, %d) AS g`, rows),
		`CREATE INDEX bench_event_occurred_at_id ON bench_event (occurred_at, id)`,
		`VACUUM ANALYZE bench_event`,
	} {
		if _, err := pool.Exec(ctx, stmt); err != nil {
			return false, fmt.Errorf("bench_event: %w", err)
		}
	}
	return true, nil
}

type eventRow struct {
	at      time.Time
	id      int64
	kind    string
	payload string
}

// readPage runs a page query and reads every row, as a handler does.
func readPage(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]eventRow, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	page := make([]eventRow, 0, PageSize)
	for rows.Next() {
		var r eventRow
		if err := rows.Scan(&r.at, &r.id, &r.kind, &r.payload); err != nil {
			return nil, err
		}
		page = append(page, r)
	}
	return page, rows.Err()
}

// counterUpsertSQL is the floor of any counter kept in PostgreSQL: one
// UNLOGGED row per key, bumped by one INSERT ... ON CONFLICT DO UPDATE
// ... RETURNING on its primary key, as a rate-limit decision is, with no
// logic at all.
const counterUpsertSQL = `INSERT INTO bench_counter AS c (key, n, at) VALUES ($1, 1, now())
	ON CONFLICT (key) DO UPDATE SET n = c.n + 1, at = now()
	RETURNING n, at`

// counterLoggedUpsertSQL is counterUpsertSQL on the LOGGED
// bench_counter_logged.
const counterLoggedUpsertSQL = `INSERT INTO bench_counter_logged AS c (key, n, at) VALUES ($1, 1, now())
	ON CONFLICT (key) DO UPDATE SET n = c.n + 1, at = now()
	RETURNING n, at`

// BuildCounter makes the UNLOGGED table bench_counter(key, n, at) of the
// one-row upsert baseline, and its LOGGED twin bench_counter_logged of
// the transactional one, if they are not there.
func BuildCounter(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, `CREATE UNLOGGED TABLE IF NOT EXISTS bench_counter (
		key text PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL)`)
	if err != nil {
		return fmt.Errorf("bench_counter: %w", err)
	}
	_, err = pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS bench_counter_logged (
		key text PRIMARY KEY, n bigint NOT NULL, at timestamptz NOT NULL)`)
	if err != nil {
		return fmt.Errorf("bench_counter_logged: %w", err)
	}
	return nil
}

// upsertLoggedCounter runs the logged upsert for key in a transaction of
// its own: BEGIN, the upsert, COMMIT.
func upsertLoggedCounter(ctx context.Context, pool *pgxpool.Pool, key string) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
	var n int64
	var at time.Time
	if err := tx.QueryRow(ctx, counterLoggedUpsertSQL, key).Scan(&n, &at); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// upsertCounter runs the one-row upsert for key.
func upsertCounter(ctx context.Context, pool *pgxpool.Pool, key string) error {
	var n int64
	var at time.Time
	return pool.QueryRow(ctx, counterUpsertSQL, key).Scan(&n, &at)
}
