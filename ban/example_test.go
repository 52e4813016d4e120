package ban_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/ban"
)

// A key refused three times within a minute is banned for a quarter of an
// hour, on every replica, until an operator lifts it. (A rate limiter does
// the counting itself: ratelimit.Options.Ban.)
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
	// pglimit.Run(ctx, pool, ...) beside the service tells every replica
	// of a ban and of a lift within a second.

	bans, err := ban.New(pool, ban.Options{After: 3, Within: time.Minute, For: 15 * time.Minute})
	if err != nil {
		log.Fatal(err)
	}
	const key = "address:198.51.100.7"
	for i := 1; i <= 3; i++ {
		until, banned, err := bans.Refused(ctx, key) // the rate limit refused key
		if err != nil {
			log.Fatal(err)
		}
		if banned {
			fmt.Printf("refusal %d: banned for about %v\n", i, time.Until(until).Round(time.Minute))
		} else {
			fmt.Printf("refusal %d: not banned\n", i)
		}
	}
	_, banned := bans.Banned(ctx, key) // from memory: no statement
	fmt.Println("banned:", banned)

	list, err := bans.List(ctx)
	if err != nil {
		log.Fatal(err)
	}
	for _, b := range list {
		fmt.Println("listed:", b.Key)
	}

	lifted, err := bans.Lift(ctx, key) // an operator lets it in again
	if err != nil {
		log.Fatal(err)
	}
	_, banned = bans.Banned(ctx, key)
	fmt.Println("lifted:", lifted, "banned:", banned)
	// Output:
	// refusal 1: not banned
	// refusal 2: not banned
	// refusal 3: banned for about 15m0s
	// banned: true
	// listed: address:198.51.100.7
	// lifted: true banned: false
}
