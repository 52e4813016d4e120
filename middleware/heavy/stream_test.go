package heavy_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// TestStreamMarks streams an export that ends on its own, one stopped by
// the row cap and one stopped by the time bound, and checks the last line
// of each and what the caller learns.
func TestStreamMarks(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 8)
	cases := []struct {
		name     string
		opts     heavy.Options
		rows     int
		perRow   string // seconds slept per row
		wantLast string
		minRows  int
	}{
		{"complete", heavy.Options{Name: "e1", Time: 10 * time.Second, Rows: 100}, 5, "0", "#complete rows=5", 5},
		{"exactly the cap", heavy.Options{Name: "e2", Time: 10 * time.Second, Rows: 5}, 5, "0", "#complete rows=5", 5},
		{"rows", heavy.Options{Name: "e3", Time: 10 * time.Second, Rows: 10}, 100, "0", "#partial bound=ROWS limit=10 rows=10", 10},
		// The time bound starts at admission; the statement's first rows
		// come after a connection and a plan, which a loaded machine can
		// take most of a short bound for (0 rows in 700 ms once, with the
		// machine's server shared by a whole test run): 3 s leaves rows to
		// count.
		{"time", heavy.Options{Name: "e4", Time: 3 * time.Second, Rows: 1000}, 1000, "0.05", "#partial bound=TIME limit=3s rows=", 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tc.opts
			opts.Key, opts.InstallationLimit = userHeader, 8
			l, err := heavy.New(pool, opts)
			if err != nil {
				t.Fatal(err)
			}
			var mark heavy.Mark
			srv := httptest.NewServer(l.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				b, _ := heavy.FromContext(r.Context())
				err := heavy.Read(r.Context(), pool, func(tx pgx.Tx) error {
					rows, err := tx.Query(r.Context(), `SELECT g, pg_sleep($2::float8) FROM generate_series(1, $1::int) g LIMIT $3`, tc.rows, tc.perRow, b.Rows+1)
					if err != nil {
						return err
					}
					mark, err = heavy.Stream(r.Context(), rows, func(rows pgx.Rows) error {
						var g int
						if err := rows.Scan(&g, nil); err != nil {
							return err
						}
						_, err := fmt.Fprintf(w, "%d\n", g)
						return err
					})
					return err
				})
				if err != nil {
					t.Errorf("export: %v", err)
				}
				fmt.Fprintln(w, mark)
			})))
			defer srv.Close()
			req, _ := http.NewRequest(http.MethodGet, srv.URL, nil)
			req.Header.Set("X-User", "alice")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var lines []string
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				lines = append(lines, sc.Text())
			}
			last := lines[len(lines)-1]
			if !strings.HasPrefix(last, tc.wantLast) {
				t.Fatalf("last line %q, want %q", last, tc.wantLast)
			}
			if got := len(lines) - 1; got != mark.Rows || got < tc.minRows {
				t.Fatalf("%d data lines, mark says %d rows, want at least %d", got, mark.Rows, tc.minRows)
			}
			if want := last != "#complete rows="+fmt.Sprint(mark.Rows); (mark.Bound != "") != want {
				t.Fatalf("Bound %q for %q", mark.Bound, last)
			}
		})
	}
}

// TestMarkStrings pins the mark lines of REFERENCE-SERVICE.md.
func TestMarkStrings(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		m    heavy.Mark
		want string
	}{
		{heavy.Mark{Rows: 7}, "#complete rows=7"},
		{heavy.Mark{Rows: 100000, Bound: heavy.BoundRows, Limit: "100000"}, "#partial bound=ROWS limit=100000 rows=100000"},
		{heavy.Mark{Rows: 42, Bound: heavy.BoundTime, Limit: heavy.FormatLimit(30 * time.Second)}, "#partial bound=TIME limit=30s rows=42"},
		{heavy.Mark{Rows: 1, Bound: heavy.BoundTime, Limit: heavy.FormatLimit(90 * time.Second)}, "#partial bound=TIME limit=90s rows=1"},
	} {
		if got := tc.m.String(); got != tc.want {
			t.Errorf("%+v: %q, want %q", tc.m, got, tc.want)
		}
	}
}

// TestReadOutsideHeavyRequest runs Read without bounds in the context.
func TestReadOutsideHeavyRequest(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	var n int
	err := heavy.Read(context.Background(), pool, func(tx pgx.Tx) error {
		return tx.QueryRow(context.Background(), `SELECT 41 + 1`).Scan(&n)
	})
	if err != nil || n != 42 {
		t.Fatalf("Read = %d, %v", n, err)
	}
	err = heavy.Read(context.Background(), pool, func(tx pgx.Tx) error {
		_, err := tx.Exec(context.Background(), `CREATE TABLE nope (x int)`)
		return err
	})
	if err == nil {
		t.Fatal("Read ran a write: its transaction is not read-only")
	}
}

// TestStreamStopsTheStatement stops a stream that would produce rows until
// its 30 s time bound, by the row cap and by an error of write: Stream
// returns well inside the bound, the statement is gone from
// pg_stat_activity when it returns, and the connection is kept (the same
// backend serves the next statement) rather than closed.
func TestStreamStopsTheStatement(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 1)
	obs := pgtest.Pool(t, url, 1)
	errWrite := errors.New("the client went away")
	for _, tc := range []struct {
		name     string
		rows     int
		failAt   int
		wantErr  error
		wantMark heavy.Mark
	}{
		{"row cap", 10, 0, nil, heavy.Mark{Rows: 10, Bound: heavy.BoundRows, Limit: "10"}},
		{"write fails", 1000, 5, errWrite, heavy.Mark{Rows: 5}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			marker := "stream-stop-" + strings.ReplaceAll(tc.name, " ", "-")
			var before, after int
			if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&before); err != nil {
				t.Fatal(err)
			}
			const bound = 30 * time.Second
			ctx, cancel := heavy.NewContext(context.Background(), heavy.Bounds{Endpoint: "e", Time: bound, Rows: tc.rows})
			defer cancel()
			start := time.Now()
			var mark heavy.Mark
			err := heavy.Read(ctx, pool, func(tx pgx.Tx) error {
				// generate_series in the select list streams its rows: the
				// statement runs until it is stopped.
				rows, err := tx.Query(ctx, `SELECT generate_series(1, 2000000000), '`+marker+`'`)
				if err != nil {
					return err
				}
				var err2 error
				mark, err2 = heavy.Stream(ctx, rows, func(rows pgx.Rows) error {
					if tc.failAt > 0 && mark.Rows >= tc.failAt {
						return errWrite
					}
					mark.Rows++
					return nil
				})
				return err2
			})
			took := time.Since(start)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Read: %v, want %v", err, tc.wantErr)
			}
			if mark != tc.wantMark {
				t.Fatalf("mark %+v, want %+v", mark, tc.wantMark)
			}
			// A behavioural bound, not a speed claim: the statement is
			// stopped, not read to its time bound (a stream read to its end
			// returns at the bound, 30 s). Half the bound tells the two apart
			// however loaded the machine: a stopped stream sends a cancel
			// request on a connection of its own and reads what the server
			// had sent before it stopped, which has taken more than 5 s on a
			// loaded machine under the race detector.
			if took > bound/2 {
				t.Errorf("Stream returned after %v; its time bound is %v: the statement ran on", took, bound)
			}
			var active int
			if err := obs.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
				WHERE datname = current_database() AND state = 'active' AND query LIKE '%'||$1||'%' AND pid <> pg_backend_pid()`, marker).Scan(&active); err != nil {
				t.Fatal(err)
			}
			if active != 0 {
				t.Errorf("the statement still runs after Stream returned")
			}
			if err := pool.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&after); err != nil {
				t.Fatal(err)
			}
			if after != before {
				t.Errorf("the connection was replaced (backend %d, then %d): a stopped stream should keep it", before, after)
			}
		})
	}
}
