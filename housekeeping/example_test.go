package housekeeping_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/housekeeping"
	"github.com/pglimit/pglimit/middleware/signin"
)

// Every replica sweeps in the background while pglimit.Run runs. Here one
// sweep is run by hand, after a failed sign-in's window lapsed.
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

	throttle, err := signin.New(pool, signin.Options{Window: 10 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	p, err := throttle.Acquire(ctx, "username:alice")
	if err != nil {
		log.Fatal(err)
	}
	_ = p.Fail(ctx)
	time.Sleep(50 * time.Millisecond) // the window lapses; the row stays until housekeeping

	deleted, err := housekeeping.Sweep(ctx, pool)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ran:", deleted != nil)
	for _, table := range []string{"heavy_permit", "request_in_flight", "upload_window", "login_attempt", "replica", "api_request_window", "refusal_minute", "ban"} {
		fmt.Println(table, deleted[table])
	}
	// Output:
	// ran: true
	// heavy_permit 0
	// request_in_flight 0
	// upload_window 0
	// login_attempt 1
	// replica 0
	// api_request_window 0
	// refusal_minute 0
	// ban 0
}
