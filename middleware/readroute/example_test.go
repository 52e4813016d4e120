package readroute_test

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/readroute"
)

// Wrap the history endpoints, read through readroute.Read, and put mayLag
// in the response. Here a second pool on the same database stands in for
// the read replica.
func Example() {
	ctx := context.Background()
	primary, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer primary.Close()
	replica, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // in production: the replica's URL
	if err != nil {
		log.Fatal(err)
	}
	defer replica.Close()

	// Timeout bounds each health check, connecting included: the default,
	// 500 ms, suits a replica on the same network; a loaded machine (this
	// example runs beside the whole test suite) needs more, or a check
	// may fail and send the read to the primary.
	router, err := readroute.New(primary, replica, readroute.Options{Timeout: 10 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	router.Check(ctx) // once now; Run checks every second until ctx ends
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = router.Run(runCtx) }()

	events := router.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var n int
		mayLag, err := readroute.Read(r.Context(), func(pool *pgxpool.Pool, _ bool) error {
			return pool.QueryRow(r.Context(), "SELECT 42").Scan(&n)
		})
		if err != nil {
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"items": []int{n}, "mayLag": mayLag})
	}))

	rec := httptest.NewRecorder()
	events.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/events", nil))
	os.Stdout.Write(rec.Body.Bytes())

	// Without a replica every read goes to the primary and mayLag is false.
	alone, err := readroute.New(primary, nil, readroute.Options{})
	if err != nil {
		log.Fatal(err)
	}
	mayLag, _ := alone.Read(ctx, func(pool *pgxpool.Pool, mayLag bool) error { return nil })
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{"mayLag": mayLag})
	// Output:
	// {"items":[42],"mayLag":true}
	// {"mayLag":false}
}
