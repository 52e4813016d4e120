package inflight_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// Wrap the API routes after authentication. The key function returns the
// token's id, never the raw token.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	pool, _ := pgxpool.New(context.Background(), url)
	defer pool.Close()

	tokens := map[string]string{"alice-token": "token-17"} // raw token -> id
	limiter, _ := inflight.New(pool, inflight.Options{
		Key: func(r *http.Request) (string, bool) {
			id, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			return id, ok
		},
		Limit:       1,
		MaxDuration: time.Minute,
	})

	inner := make(chan int, 1)
	var handler http.Handler
	handler = limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/outer" {
			// While this request is in flight, the same token tries another.
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/inner", nil)
			req.Header.Set("Authorization", "Bearer alice-token")
			handler.ServeHTTP(rec, req)
			inner <- rec.Code
		}
	}))

	req := httptest.NewRequest(http.MethodGet, "/outer", nil)
	req.Header.Set("Authorization", "Bearer alice-token")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Println("outer", rec.Code, "inner", <-inner)
	// Output: outer 200 inner 429
}
