package ratelimit_test

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
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// Wrap the API routes after authentication: each API token may make two
// requests at once and then one every 30 seconds, across every replica.
// The key function returns the token's id, never the raw token.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil { // pglimit's tables, in the schema pglimit
		log.Fatal(err)
	}

	tokens := map[string]string{"alice-token": "token-17"} // raw token -> id
	limiter, err := ratelimit.New(pool, ratelimit.Options{
		Policies: []ratelimit.Policy{{Name: "api", Limit: 2, Window: time.Minute}},
	})
	if err != nil {
		log.Fatal(err)
	}
	mw, err := mratelimit.New(mratelimit.Options{
		Limiter: limiter,
		Key: func(r *http.Request) (string, bool) {
			id, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			return id, ok
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := mw.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintln(w, "hello")
	}))

	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/api/things", nil)
		req.Header.Set("Authorization", "Bearer alice-token")
		rec := httptest.NewRecorder()
		api.ServeHTTP(rec, req)
		fmt.Println(strings.TrimSpace(fmt.Sprint(rec.Code, " ", rec.Header().Get("RateLimit-Policy"), " ",
			rec.Header().Get("RateLimit"), " ", rec.Header().Get("Retry-After"))))
	}
	// Output:
	// 200 "api";q=2;w=60 "api";r=1;t=30
	// 200 "api";q=2;w=60 "api";r=0;t=30
	// 429 "api";q=2;w=60 "api";r=0;t=30 30
}
