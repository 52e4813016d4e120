package replica_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/replica"
)

// Each replica makes its registry and gives it to pglimit.Run, which
// heartbeats it in the background until shutdown; any replica can count
// the ready ones. A service's /readyz reports Ready, and it calls Drain
// when it stops taking requests.
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
	n, _ := first.ReadyReplicas(ctx)
	fmt.Println("before any heartbeat, each counts itself:", n)

	runCtx, shutdown := context.WithCancel(ctx)
	done := make(chan error, 2)
	for _, r := range []*replica.Registry{first, second} {
		go func() { done <- pglimit.Run(runCtx, pool, pglimit.RunOptions{Registry: r}) }()
	}
	for !first.Ready() || !second.Ready() { // the first heartbeats
		time.Sleep(10 * time.Millisecond)
	}
	n, _ = first.ReadyReplicas(ctx)
	fmt.Println("ready replicas:", n)

	if err := second.Drain(ctx); err != nil { // second stops taking requests
		log.Print(err)
	}
	n, _ = first.ReadyReplicas(ctx)
	fmt.Println("one draining:", n)

	shutdown() // each Run marks its row not ready, deletes it and returns nil
	fmt.Println(<-done, <-done)
	// Output:
	// before any heartbeat, each counts itself: 1
	// ready replicas: 2
	// one draining: 1
	// <nil> <nil>
}
