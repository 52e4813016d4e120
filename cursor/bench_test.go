package cursor_test

// The SQL in this file is a benchmark fixture, not a package API: a table
// shaped like a history table and the two page queries and two counts the
// package documentation tells a handler to run, written inline because
// what is measured is PostgreSQL's plan for each shape (the reference
// service keeps its real queries in sqlc).

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// benchRows is the size of the fixture table: 2,000,000 rows, or
// BENCH_EVENT_ROWS, or 20,000 under -short.
func benchRows(b *testing.B) int {
	if s := os.Getenv("BENCH_EVENT_ROWS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 100 {
			b.Fatalf("BENCH_EVENT_ROWS=%q: want a number of at least 100", s)
		}
		return n
	}
	if testing.Short() {
		return 20_000
	}
	return 2_000_000
}

// benchEvent builds bench_event(occurred_at, id, kind, payload) with rows
// rows in a fresh database, three rows to a timestamp (so ties on
// occurred_at are broken by id), and an index on (occurred_at, id). One
// INSERT ... SELECT FROM generate_series; about 10 s for 2,000,000 rows.
func benchEvent(b *testing.B, rows int) *pgxpool.Pool {
	b.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(b, pgtest.URL(b), 4)
	start := time.Now()
	for _, stmt := range []string{
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
			b.Fatalf("fixture: %v", err)
		}
	}
	b.Logf("bench_event: %d rows built in %s", rows, time.Since(start).Round(time.Millisecond))
	return pool
}

const (
	firstPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		ORDER BY occurred_at DESC, id DESC LIMIT $1`
	offsetPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		ORDER BY occurred_at DESC, id DESC LIMIT $1 OFFSET $2`
	keysetPageSQL = `SELECT occurred_at, id, kind, payload FROM bench_event
		WHERE (occurred_at, id) < ($1, $2)
		ORDER BY occurred_at DESC, id DESC LIMIT $3`
	exactCountSQL  = `SELECT count(*) FROM bench_event`
	cappedCountSQL = `SELECT count(*) FROM (SELECT 1 FROM bench_event LIMIT $1) s`
)

type benchRow struct {
	at      time.Time
	id      int64
	kind    string
	payload string
}

// readPage runs a page query and reads every row, as a handler does.
func readPage(ctx context.Context, pool *pgxpool.Pool, sql string, args ...any) ([]benchRow, error) {
	rows, err := pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	page := make([]benchRow, 0, 50)
	for rows.Next() {
		var r benchRow
		if err := rows.Scan(&r.at, &r.id, &r.kind, &r.payload); err != nil {
			return nil, err
		}
		page = append(page, r)
	}
	return page, rows.Err()
}

// BenchmarkPage reads a 50-row page at several depths, by keyset (a cursor
// of the row before the page, decoded and re-encoded as a handler does) and
// by OFFSET, with a SELECT 1 round trip as the floor. Compare with
// benchstat: BenchmarkPage/keyset/depth=N against BenchmarkPage/offset/depth=N.
func BenchmarkPage(b *testing.B) {
	rows := benchRows(b)
	pool := benchEvent(b, rows)
	ctx := context.Background()
	pager, err := cursor.NewPager(nil, cursor.Rules{})
	if err != nil {
		b.Fatal(err)
	}
	const size = 50

	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := db.New().SessionPing(ctx, pool); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, depth := range []int{0, 10_000, 100_000, 1_000_000, 1_990_000} {
		if depth+size > rows {
			continue
		}
		// The cursor a client holds at this depth: the row just before the page.
		var after string
		var want int64 // id of the first row of the page, to check both ways agree
		if depth > 0 {
			prev, err := readPage(ctx, pool, offsetPageSQL, 1, depth-1)
			if err != nil || len(prev) != 1 {
				b.Fatalf("depth %d: %v", depth, err)
			}
			after = pager.Encode("bench", cursor.Position{At: prev[0].at, ID: prev[0].id})
		}
		first, err := readPage(ctx, pool, offsetPageSQL, 1, depth)
		if err != nil || len(first) != 1 {
			b.Fatalf("depth %d: %v", depth, err)
		}
		want = first[0].id

		b.Run(fmt.Sprintf("keyset/depth=%d", depth), func(b *testing.B) {
			q := map[string][]string{"size": {strconv.Itoa(size)}}
			if after != "" {
				q["after"] = []string{after}
			}
			for b.Loop() {
				page, err := pager.Parse(q, "bench")
				if err != nil {
					b.Fatal(err)
				}
				var got []benchRow
				if page.After != nil {
					got, err = readPage(ctx, pool, keysetPageSQL, page.After.At, page.After.ID, page.Size)
				} else {
					got, err = readPage(ctx, pool, firstPageSQL, page.Size)
				}
				if err != nil || len(got) != size || got[0].id != want {
					b.Fatalf("keyset page at %d: %d rows, %v", depth, len(got), err)
				}
				last := got[len(got)-1]
				if pager.Next("bench", page, len(got), cursor.Position{At: last.at, ID: last.id}) == "" {
					b.Fatal("no next cursor")
				}
			}
		})
		b.Run(fmt.Sprintf("offset/depth=%d", depth), func(b *testing.B) {
			for b.Loop() {
				got, err := readPage(ctx, pool, offsetPageSQL, size, depth)
				if err != nil || len(got) != size || got[0].id != want {
					b.Fatalf("offset page at %d: %d rows, %v", depth, len(got), err)
				}
			}
		})
	}
}

// BenchmarkTotal compares the page-mode total the package recommends (a
// count capped at Limit+1 rows) with an exact count of the whole table,
// with a SELECT 1 round trip as the floor.
func BenchmarkTotal(b *testing.B) {
	rows := benchRows(b)
	pool := benchEvent(b, rows)
	ctx := context.Background()
	pager, err := cursor.NewPager(nil, cursor.Rules{})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("ping", func(b *testing.B) {
		for b.Loop() {
			if err := db.New().SessionPing(ctx, pool); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("exact-count", func(b *testing.B) {
		for b.Loop() {
			var n int64
			if err := pool.QueryRow(ctx, exactCountSQL).Scan(&n); err != nil || n != int64(rows) {
				b.Fatalf("count = %d, %v", n, err)
			}
		}
	})
	b.Run("capped-count", func(b *testing.B) {
		for b.Loop() {
			var n int64
			if err := pool.QueryRow(ctx, cappedCountSQL, pager.CountLimit()).Scan(&n); err != nil {
				b.Fatal(err)
			}
			if total, capped := pager.Total(n); total != int64(min(rows, 10_000)) || capped != (rows > 10_000) {
				b.Fatalf("total = %d, %v", total, capped)
			}
		}
	})
}

// BenchmarkCodec is the cursor's own cost per request: parse and verify an
// after cursor, and sign the next one.
func BenchmarkCodec(b *testing.B) {
	pager, _ := cursor.NewPager(nil, cursor.Rules{})
	pos := cursor.Position{At: time.Now(), ID: 123456}
	q := map[string][]string{"after": {pager.Encode("event-history", pos)}, "size": {"50"}}
	b.Run("parse", func(b *testing.B) {
		for b.Loop() {
			if _, err := pager.Parse(q, "event-history"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encode", func(b *testing.B) {
		for b.Loop() {
			_ = pager.Encode("event-history", pos)
		}
	})
}
