package pglimitgrpc_test

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/pglimit"
	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/ratelimit"
)

// A gRPC server whose calls are held to a rate per tenant (the metadata
// x-tenant) and a cap on the calls each tenant has in flight, counted in
// PostgreSQL across every replica. The Limiters are the ones an HTTP front
// uses: the rate engine knows no HTTP, and the in-flight cap's HTTP key is
// not read here.
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

	noHTTP := func(*http.Request) (string, bool) { return "", false } // this service has no HTTP front
	rl, err := ratelimit.New(pool, ratelimit.Options{Name: "example-api",
		Policies: []ratelimit.Policy{{Name: "per-tenant", Limit: 2, Window: time.Minute}}})
	if err != nil {
		log.Fatal(err)
	}
	capper, err := inflight.New(pool, inflight.Options{Name: "example-in-flight", Key: noHTTP, Limit: 4})
	if err != nil {
		log.Fatal(err)
	}
	key := pglimitgrpc.MetadataKey("x-tenant")
	rate, err := pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: key})
	if err != nil {
		log.Fatal(err)
	}
	inFlight, err := pglimitgrpc.InFlight(capper, pglimitgrpc.Options{Key: key})
	if err != nil {
		log.Fatal(err)
	}
	srv := grpc.NewServer(
		grpc.ChainUnaryInterceptor(rate.Unary(), inFlight.Unary()),
		grpc.ChainStreamInterceptor(rate.Stream(), inFlight.Stream()),
	)
	healthpb.RegisterHealthServer(srv, &health{})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = srv.Serve(ln) }()
	defer srv.Stop()

	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	client := healthpb.NewHealthClient(conn)
	call := metadata.AppendToOutgoingContext(ctx, "x-tenant", "example-tenant")
	for range 3 {
		var header metadata.MD
		_, err := client.Check(call, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		fmt.Println(status.Code(err), header.Get("ratelimit"))
	}
	// Output:
	// OK ["per-tenant";r=1;t=30]
	// OK ["per-tenant";r=0;t=30]
	// ResourceExhausted []
}
