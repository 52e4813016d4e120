package heavy_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// TestStreamMarks streams an export that ends on its own, one stopped by
// the row cap and one stopped by the time bound, and checks the last line
// of each and what the caller learns.
func TestStreamMarks(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	pool := pgtest.Pool(t, url, 8)
	l, err := heavy.New(pool, heavy.Options{User: userHeader, InstallationCap: 8})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name     string
		ep       heavy.Endpoint
		rows     int
		perRow   string // seconds slept per row
		wantLast string
		minRows  int
	}{
		{"complete", heavy.Endpoint{Name: "e1", Time: 10 * time.Second, Rows: 100}, 5, "0", "#complete rows=5", 5},
		{"exactly the cap", heavy.Endpoint{Name: "e2", Time: 10 * time.Second, Rows: 5}, 5, "0", "#complete rows=5", 5},
		{"rows", heavy.Endpoint{Name: "e3", Time: 10 * time.Second, Rows: 10}, 100, "0", "#partial bound=ROWS limit=10 rows=10", 10},
		{"time", heavy.Endpoint{Name: "e4", Time: 700 * time.Millisecond, Rows: 1000}, 1000, "0.05", "#partial bound=TIME limit=700ms rows=", 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mark heavy.Mark
			srv := httptest.NewServer(l.Handler(tc.ep, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
			if want := last != "#complete rows="+fmt.Sprint(mark.Rows); mark.Partial() != want {
				t.Fatalf("Partial() = %v for %q", mark.Partial(), last)
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
