package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/ratelimit"
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
		Key: func(r *http.Request) (string, bool) {
			id, ok := tokens[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
			return id, ok
		},
		Policies: []ratelimit.Policy{{Name: "api", Limit: 2, Window: time.Minute}},
	})
	if err != nil {
		log.Fatal(err)
	}
	api := limiter.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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

// Outside HTTP — a job runner, a queue consumer — AcquireN spends a
// weighted cost under several policies at once, all or nothing.
func ExampleLimiter_AcquireN() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil { // pglimit's tables, in the schema pglimit
		log.Fatal(err)
	}

	exports, err := ratelimit.New(pool, ratelimit.Options{
		Name: "exports",
		Key:  func(*http.Request) (string, bool) { return "", false }, // not used outside HTTP
		Policies: []ratelimit.Policy{
			{Name: "per-minute", Limit: 10, Window: time.Minute},
			{Name: "per-day", Limit: 12, Window: 24 * time.Hour},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, rows := range []int{4, 5, 4} { // a unit per 1,000 rows exported
		p, err := exports.AcquireN(ctx, "tenant-42", rows, nil)
		var refused *ratelimit.LimitError
		switch {
		case errors.As(err, &refused):
			fmt.Printf("cost %d refused by %v\n", rows, refused.Violated)
		case err != nil:
			log.Fatal(err) // the database could not decide
		default:
			fmt.Printf("cost %d granted, %d left today\n", rows, p.Policies[1].Remaining)
		}
	}
	// Output:
	// cost 4 granted, 8 left today
	// cost 5 granted, 3 left today
	// cost 4 refused by [per-minute per-day]
}
