package pgtest_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/pgtest"
)

// A runnable example has no testing.T: ForExample gives it a database
// migrated with pglimit's schema and the function that drops it.
func ExampleForExample() {
	url, cleanup := pgtest.ForExample()
	defer cleanup()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	limiter, err := inflight.New(pool, inflight.Options{Name: "example", Limit: 1,
		Key: func(*http.Request) (string, bool) { return "alice", true }})
	if err != nil {
		panic(err)
	}
	handler := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "served")
	}))
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/report", nil))
	fmt.Println(rec.Code, rec.Body)
	// Output: 200 served
}
