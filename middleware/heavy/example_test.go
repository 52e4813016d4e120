package heavy_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// Declare the endpoint where it is served, wrap its handler, and read the
// database through heavy.Read so the time bound reaches the database.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	pool, _ := pgxpool.New(context.Background(), url)
	defer pool.Close()

	limiter, _ := heavy.New(pool, heavy.Options{
		User: func(r *http.Request) (string, bool) { return r.Header.Get("X-User"), true },
	})
	console := heavy.Endpoint{Name: "sql-console", PerUser: 2, Time: 30 * time.Second, Rows: 1000}
	handler := limiter.Handler(console, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var answer int
		err := heavy.Read(r.Context(), pool, func(tx pgx.Tx) error {
			return tx.QueryRow(r.Context(), "SELECT 6 * 7").Scan(&answer)
		})
		if err != nil {
			heavy.WriteError(w, r, err) // 503 heavy-request-timed-out at the bound
			return
		}
		fmt.Fprintln(w, answer)
	}))

	req := httptest.NewRequest(http.MethodPost, "/api/sql", nil)
	req.Header.Set("X-User", "alice")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output: 200 42
}
