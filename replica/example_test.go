package replica_test

import (
	"context"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/replica"
)

// Each replica runs its registry in the background until it shuts down
// (pglimit.Run does, with housekeeping); any of them can count the ready
// ones. A service's /readyz reports Ready.
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

	// Two replicas of one service, here in one process.
	first, err := replica.New(pool, replica.Options{Name: "studio-1"})
	if err != nil {
		log.Fatal(err)
	}
	second, err := replica.New(pool, replica.Options{Name: "studio-2"})
	if err != nil {
		log.Fatal(err)
	}
	runCtx, shutdown := context.WithCancel(ctx)
	done := make(chan error, 2)
	for _, r := range []*replica.Registry{first, second} {
		if err := r.Heartbeat(ctx); err != nil { // counted at once; Run keeps it so
			log.Print(err)
		}
		go func() { done <- r.Run(runCtx) }() // heartbeat every 5 s until shutdown
	}
	n, _ := first.ReadyReplicas(ctx)
	fmt.Println("ready replicas:", n)

	shutdown() // each Run marks its row not ready, deletes it and returns nil
	fmt.Println(<-done, <-done)
	n, _ = first.ReadyReplicas(ctx)
	fmt.Println("none left, still counts itself:", n)
	// Output:
	// ready replicas: 2
	// <nil> <nil>
	// none left, still counts itself: 1
}
