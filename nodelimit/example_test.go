package nodelimit_test

import (
	"context"
	"fmt"
	"net/http/httptest"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/pgtest"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/nodelimit/fakenode"
	"github.com/pglimit/pglimit/nodelimit/jolokia"
	"github.com/pglimit/pglimit/replica"
)

// A replica registers, takes its share of each node's rate from the
// registry, and lists a node's queues through Jolokia: one search call and
// reads in batches of 200, every call waiting for its turn.
func Example() {
	url, drop := pgtest.ForExample()
	defer drop()
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, url)
	defer pool.Close()

	registry, _ := replica.New(pool, replica.Options{Name: "studio-1"})
	_ = registry.Start(ctx)
	defer registry.Stop(ctx)

	limiter, err := nodelimit.New(nodelimit.Options{Rate: 20, Replicas: registry})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer limiter.Close()
	_ = limiter.Refresh(ctx) // at once, rather than in the background

	fake, _ := fakenode.New(fakenode.Options{Queues: 450})
	broker := httptest.NewServer(fake) // stands in for http://broker-1:8161
	defer broker.Close()

	node, _ := limiter.Node("broker-1")
	client, err := jolokia.New(broker.URL, node, jolokia.Options{})
	if err != nil {
		fmt.Println(err)
		return
	}
	queues, err := client.Queues(ctx)
	if err != nil {
		fmt.Println(err) // jolokia.ErrNode: 502; nodelimit.ErrNoTurn: the request ended first
		return
	}
	fmt.Printf("share: %v calls/s of %v, %d ready\n", node.Limit(), node.Rate(), limiter.ReadyReplicas())
	fmt.Printf("%d queues; %s has %d messages, %d consumers\n",
		len(queues), queues[0].Name, queues[0].MessageCount, queues[0].ConsumerCount)
	st := fake.Stats()
	fmt.Printf("the node received %d calls: %d search, %d read, at most %d reads each\n",
		st.Calls, st.ByKind["search"], st.ByKind["read"], st.MaxRequestsPerCall)
	// Output:
	// share: 20 calls/s of 20, 1 ready
	// 450 queues; q1 has 3 messages, 1 consumers
	// the node received 4 calls: 1 search, 3 read, at most 200 reads each
}

// Share is the rate divided by the ready replicas, rounded up, at least 1.
func ExampleShare() {
	fmt.Println(nodelimit.Share(20, 3), nodelimit.Share(6, 3), nodelimit.Share(2, 3))
	// Output: 7 2 1
}

// ReadAll keeps the order of the items across its batches.
func ExampleReadAll() {
	names := make([]string, 450)
	for i := range names {
		names[i] = fmt.Sprintf("q%d", i+1)
	}
	lengths, _ := nodelimit.ReadAll(context.Background(), names, nodelimit.BatchSize,
		func(_ context.Context, batch []string) ([]int, error) {
			fmt.Println("one call with", len(batch), "reads, from", batch[0])
			out := make([]int, len(batch))
			for i, n := range batch {
				out[i] = len(n)
			}
			return out, nil
		})
	fmt.Println(len(lengths), lengths[0], lengths[449])
	// Output:
	// one call with 200 reads, from q1
	// one call with 200 reads, from q201
	// one call with 50 reads, from q401
	// 450 2 4
}
