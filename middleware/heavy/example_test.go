package heavy_test

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

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// One Limiter per heavy endpoint, declared where it is served: wrap the
// endpoint's handler, and read the database through heavy.Read so the time
// bound reaches the database.
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

	// Your authentication's answer: who the request's token belongs to.
	// Never a header the client sets: the key is whose cap is spent.
	sessions := map[string]string{"alice-token": "alice"}
	userOf := func(r *http.Request) (string, bool) {
		user, ok := sessions[strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")]
		return user, ok
	}
	console, err := heavy.New(pool, heavy.Options{
		Name: "sql-console", Key: userOf, Limit: 2, Time: 30 * time.Second, Rows: 1000,
	})
	if err != nil {
		log.Fatal(err)
	}
	// At shutdown, after the server stopped serving: the permits' releases
	// do not keep a response waiting, and Flush sees them to the database.
	defer console.Flush(ctx)
	handler := console.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	req.Header.Set("Authorization", "Bearer alice-token")
	rec := httptest.NewRecorder()
	handler.ServeHTTP(rec, req)
	fmt.Print(rec.Code, " ", rec.Body.String())
	// Output: 200 42
}

// A job runner takes the same permits without HTTP, and bounds its work
// with them.
func ExampleLimiter_Acquire() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	reports, err := heavy.New(pool, heavy.Options{
		Name: "nightly-report", Key: func(*http.Request) (string, bool) { return "", false }, // Handler unused
		Limit: 1, Time: time.Minute,
	})
	if err != nil {
		log.Fatal(err)
	}
	// Before the process exits, Flush waits for any release whose caller
	// stopped waiting for it.
	defer reports.Flush(ctx)
	p, err := reports.Acquire(ctx, "reporting-job")
	if err != nil {
		log.Fatal(err)
	}
	defer p.Release(ctx)
	_, err = reports.Acquire(ctx, "reporting-job") // a second run of the same job, meanwhile
	var refused *limit.Refusal
	if errors.As(err, &refused) {
		fmt.Println(refused.Kind, refused.Name, refused.Scope, refused.Limit, refused.RetryAfter > 0)
	}

	work, cancel := heavy.NewContext(ctx, reports.Bounds()) // ends at the time bound
	defer cancel()
	b, _ := heavy.FromContext(work)
	fmt.Println(b.Endpoint, b.Time)
	// Output:
	// heavy nightly-report user 1 true
	// nightly-report 1m0s
}
