package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"

	"github.com/pglimit/pglimit/cmd/internal/bench"
	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/ratelimit"
)

// kindGRPC is a whole gRPC call through the interceptors of the gRPC front
// (module ./grpc).
const kindGRPC bench.Kind = "grpc"

// Names of the gRPC paths.
const (
	nameGRPCAlone    = "gRPC call alone"
	nameGRPCRate     = "gRPC call, rate limit"
	nameGRPCInflight = "gRPC call, in-flight cap"
)

// serving answers every health check at once: the handler of the gRPC
// paths.
type serving struct {
	healthpb.UnimplementedHealthServer
}

func (serving) Check(context.Context, *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

// grpcPaths are whole unary calls over loopback TCP — one client
// connection per server, a real pool — bare and through the gRPC front's
// rate limit and in-flight interceptors: what a call pays end to end. Each
// loop is its own tenant (the metadata x-key), so nothing is refused. Call
// the returned func to stop the servers.
func grpcPaths(pool *pgxpool.Pool) ([]bench.Path, func(), error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	noHTTP := func(*http.Request) (string, bool) { return "", false }
	rl, err := ratelimit.New(pool, ratelimit.Options{Name: "bench-grpc", Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1_000_000, Window: time.Second}}})
	if err != nil {
		return nil, nil, err
	}
	flight, err := inflight.New(pool, inflight.Options{Name: "bench-grpc", Key: noHTTP, Replica: "bench", Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	key := pglimitgrpc.MetadataKey("x-key")
	rate, err := pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: key, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	capper, err := pglimitgrpc.InFlight(flight, pglimitgrpc.Options{Key: key, Logger: quiet})
	if err != nil {
		return nil, nil, err
	}
	chains := []struct {
		name, what string
		i          *pglimitgrpc.Interceptor
	}{
		{nameGRPCAlone, "a unary call (grpc.health.v1 Check) over loopback TCP to a handler answering at once, no interceptor: the floor of a call", nil},
		{nameGRPCRate, "the same call through pglimitgrpc.RateLimit: a rate decision (one statement) and its RateLimit values as header metadata", rate},
		{nameGRPCInflight, "the same call through pglimitgrpc.InFlight: a slot claimed before the handler, released before the call ends", capper},
	}
	var stops []func()
	stop := func() {
		for _, s := range stops {
			s()
		}
	}
	run := strconv.FormatInt(time.Now().UnixNano(), 36)
	var paths []bench.Path
	for _, c := range chains {
		var opts []grpc.ServerOption
		if c.i != nil {
			opts = append(opts, grpc.UnaryInterceptor(c.i.Unary()))
		}
		srv := grpc.NewServer(opts...)
		healthpb.RegisterHealthServer(srv, serving{})
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			stop()
			return nil, nil, err
		}
		go func() { _ = srv.Serve(ln) }()
		conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			srv.Stop()
			stop()
			return nil, nil, err
		}
		stops = append(stops, func() { conn.Close(); srv.Stop() })
		client := healthpb.NewHealthClient(conn)
		paths = append(paths, bench.Path{Name: c.name, Kind: kindGRPC, What: c.what, New: func(w int) (bench.Op, error) {
			k := "grpc-" + run + "-" + strconv.Itoa(w)
			req := &healthpb.HealthCheckRequest{}
			return func(ctx context.Context) error {
				_, err := client.Check(metadata.AppendToOutgoingContext(ctx, "x-key", k), req)
				return err
			}, nil
		}})
	}
	return paths, stop, nil
}

// grpcSection writes the gRPC paths beside the bare call.
func (r *Report) grpcSection(b *strings.Builder) {
	var paths []bench.Path
	for _, p := range r.Paths {
		if p.Kind == kindGRPC {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## The gRPC call\n\n")
	w("What a gRPC call pays end to end through the gRPC front (module `./grpc`, package `pglimitgrpc`): a unary call from one client connection over loopback TCP, with a real pool, beside the same call with no interceptor, measured in the same rounds. `go test -bench Call ./grpc/` measures the same three as a Go benchmark (its x-bare is the same ratio).\n\n")
	w("| call | clients | p50 | p99 | ops/s | added to the bare call (p50) | ÷ bare call p50 |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, clients := range r.Options.clients {
		alone, ok := r.find(nameGRPCAlone, clients)
		for _, p := range paths {
			m, found := r.find(p.Name, clients)
			if !found {
				continue
			}
			added, ratio := "–", "–"
			if ok && alone.P50 > 0 {
				added = formatDur(m.P50 - alone.P50)
				ratio = formatRatio(float64(m.P50) / float64(alone.P50))
			}
			w("| %s | %d | %s | %s | %s | %s | %s |\n", p.Name, clients,
				formatDur(m.P50), formatDur(m.P99), formatOps(m.Throughput()), added, ratio)
		}
	}
	w("\n")
	for _, p := range paths {
		w("- **%s** — %s\n", p.Name, p.What)
	}
}
