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

// Every replica runs housekeeping in the background, usually through
// pglimit.Run (with the replica registry), or on its own:
//
//	h, err := housekeeping.New(pool, housekeeping.Options{})
//	go func() { errc <- h.Run(ctx) }() // until ctx ends
//
// Here one sweep is run by hand, after a failed sign-in's window lapsed.
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

	h, err := housekeeping.New(pool, housekeeping.Options{})
	if err != nil {
		log.Fatal(err)
	}
	res, err := h.RunOnce(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("ran:", res.Ran)
	for _, table := range housekeeping.Tables {
		fmt.Println(table, res.Deleted[table])
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
}
