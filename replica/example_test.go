package replica_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/replica"
)

// Each replica registers at start and stops cleanly at shutdown; any of
// them can count the ready ones. A service's /readyz reports Ready.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, url)
	defer pool.Close()

	first, _ := replica.New(pool, replica.Options{Name: "studio-1", Interval: 5 * time.Second})
	second, _ := replica.New(pool, replica.Options{Name: "studio-2"})
	for _, r := range []*replica.Registry{first, second} {
		if err := r.Start(ctx); err != nil {
			fmt.Println("registry:", err) // it keeps trying; Ready says false meanwhile
		}
	}
	n, _ := first.ReadyReplicas(ctx)
	fmt.Println("ready:", first.Ready(), "ready replicas:", n)

	_ = second.Stop(ctx) // marks its row not ready, then deletes it
	n, _ = first.ReadyReplicas(ctx)
	fmt.Println("after studio-2 stopped:", n)

	_ = first.Stop(ctx)
	n, _ = first.ReadyReplicas(ctx)
	fmt.Println("none left, still counts itself:", n)
	// Output:
	// ready: true ready replicas: 2
	// after studio-2 stopped: 1
	// none left, still counts itself: 1
}
