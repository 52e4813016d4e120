package readroute_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/readroute"
)

// Wrap the history endpoints, read through readroute.Read, and put mayLag
// in the response. Here a second pool on the same database stands in for
// the read replica.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	ctx := context.Background()
	primary, _ := pgxpool.New(ctx, url)
	defer primary.Close()
	replica, _ := pgxpool.New(ctx, url) // in production: the replica's URL
	defer replica.Close()

	router, _ := readroute.New(primary, replica, readroute.Options{})
	router.Start() // checks the replica now, then every second
	defer router.Close()

	events := router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		err := readroute.Read(r.Context(), func(pool *pgxpool.Pool, mayLag bool) error {
			return pool.QueryRow(r.Context(), "SELECT 42").Scan(&n)
		})
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": []int{n}, "mayLag": readroute.MayLag(r.Context())})
	}))

	rec := httptest.NewRecorder()
	events.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/events", nil))
	os.Stdout.Write(rec.Body.Bytes())

	// Without a replica every read goes to the primary and mayLag is false.
	alone, _ := readroute.New(primary, nil, readroute.Options{})
	mayLag, _ := alone.Read(ctx, func(pool *pgxpool.Pool, mayLag bool) error { return nil })
	json.NewEncoder(os.Stdout).Encode(map[string]any{"mayLag": mayLag})
	// Output:
	// {"items":[42],"mayLag":true}
	// {"mayLag":false}
}
