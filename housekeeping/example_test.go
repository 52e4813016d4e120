package housekeeping_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/housekeeping"
	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/middleware/signin"
)

// A service starts housekeeping.Run in the background on every replica:
//
//	go housekeeping.Run(ctx, pool, housekeeping.Options{})
//
// Here one sweep is run by hand, after a failed sign-in's window lapsed.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	pool, _ := pgxpool.New(context.Background(), url)
	defer pool.Close()
	ctx := context.Background()

	throttle, _ := signin.New(pool, signin.Options{Window: 10 * time.Millisecond})
	attempt, _ := throttle.Check(ctx, "username:alice")
	_ = attempt.RecordFailure(ctx)
	time.Sleep(50 * time.Millisecond) // the window lapses; the row stays until housekeeping

	h, _ := housekeeping.New(pool, housekeeping.Options{})
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
}
