package nodelimit_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/replica"
)

// A replica takes its share of each node's rate from the replica registry
// and waits for its turn before every call to the node. Run the registry
// (through pglimit.Run) and the limiter in the background until shutdown.
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

	registry, err := replica.New(pool, replica.Options{Name: "studio-1"})
	if err != nil {
		log.Fatal(err)
	}
	limiter, err := nodelimit.New(nodelimit.Options{Rate: 20, Replicas: registry.ReadyReplicas})
	if err != nil {
		log.Fatal(err)
	}
	_ = limiter.Refresh(ctx) // the first share at once (the registry counts this replica)
	node, err := limiter.Node("broker-1")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("this replica's share: %v calls/s\n", node.Limit())
	// Run re-reads the count at once and then every 5 s. While this
	// replica's first heartbeat lands, a read may count it twice (its
	// share then errs low, never high, until the next read).
	runCtx, shutdown := context.WithCancel(ctx)
	defer shutdown()
	go func() { _ = pglimit.Run(runCtx, pool, pglimit.RunOptions{Registry: registry}) }() // heartbeat every 5 s
	go func() { _ = limiter.Run(runCtx) }()                                               // re-read the ready count every 5 s

	broker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, `[{"status":200,"value":[]}]`)
	})) // stands in for http://broker-1:8161
	defer broker.Close()

	for range 3 {
		// One HTTP POST is one call: wait for this replica's turn first.
		if err := node.Wait(ctx); err != nil {
			fmt.Println(err) // errors.Is(err, nodelimit.ErrNoTurn): the request ended first
			return
		}
		resp, err := http.Post(broker.URL+"/jolokia/", "application/json", strings.NewReader(`[{"type":"search"}]`))
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
	}
	// Output:
	// this replica's share: 20 calls/s
}
