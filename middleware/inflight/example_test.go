package inflight_test

import (
	"context"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// Wrap the whole API. The key function returns the token's id, never the
// raw token; a request without a token passes through uncounted (the
// handler, or an authentication middleware, decides what to do with it).
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	tokens := map[string]string{"alice-token": "token-17"} // raw token -> id, as your token store has it
	limiter, err := inflight.New(pool, inflight.Options{
		Key: func(r *http.Request) (string, bool) {
			id, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			return id, ok
		},
		Limit:       1,
		MaxDuration: time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}

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

	rec = httptest.NewRecorder()
	handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/no-token", nil))
	fmt.Println("no token", rec.Code)
	// Output:
	// outer 200 inner 429
	// no token 200
}
