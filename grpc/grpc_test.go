package pglimitgrpc_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	grpcratelimit "github.com/grpc-ecosystem/go-grpc-middleware/v2/interceptors/ratelimit"
	"github.com/jackc/pgx/v5/pgxpool"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/ratelimit"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// noHTTP is the HTTP key of an in-flight cap or heavy endpoint that
// serves gRPC only.
func noHTTP(*http.Request) (string, bool) { return "", false }

// tenant is the key of the tests' calls: the metadata x-tenant.
var tenant = pglimitgrpc.MetadataKey("x-tenant")

// Full method names of the health service, the tests' stand-in service.
const (
	methodCheck = "/grpc.health.v1.Health/Check"
	methodWatch = "/grpc.health.v1.Health/Watch"
)

// health is the tests' service: Check and Watch run check and watch when
// set, and answer SERVING at once otherwise.
type health struct {
	healthpb.UnimplementedHealthServer
	check func(ctx context.Context) error
	watch func(stream grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error
}

func (h *health) Check(ctx context.Context, _ *healthpb.HealthCheckRequest) (*healthpb.HealthCheckResponse, error) {
	if h.check != nil {
		if err := h.check(ctx); err != nil {
			return nil, err
		}
	}
	return &healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}, nil
}

func (h *health) Watch(_ *healthpb.HealthCheckRequest, s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
	if h.watch != nil {
		return h.watch(s)
	}
	return s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING})
}

// serve starts a gRPC server of svc (nil: one answering at once) behind
// the interceptors on a loopback port, a stand-in for one replica, and
// returns a client of it.
func serve(t testing.TB, svc *health, interceptors ...*pglimitgrpc.Interceptor) healthpb.HealthClient {
	t.Helper()
	var unary []grpc.UnaryServerInterceptor
	var streams []grpc.StreamServerInterceptor
	for _, i := range interceptors {
		unary = append(unary, i.Unary())
		streams = append(streams, i.Stream())
	}
	return serveWith(t, svc, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(streams...))
}

func serveWith(t testing.TB, svc *health, opts ...grpc.ServerOption) healthpb.HealthClient {
	t.Helper()
	if svc == nil {
		svc = &health{}
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(opts...)
	healthpb.RegisterHealthServer(srv, svc)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return healthpb.NewHealthClient(conn)
}

// as is ctx with the metadata x-tenant: key.
func as(ctx context.Context, key string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, "x-tenant", key)
}

func newRate(t testing.TB, pool *pgxpool.Pool, opts ratelimit.Options) *ratelimit.Limiter {
	t.Helper()
	l, err := ratelimit.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// must is i, made with no error (a test's options are good).
func must(i *pglimitgrpc.Interceptor, err error) *pglimitgrpc.Interceptor {
	if err != nil {
		panic(err)
	}
	return i
}

// reasonOf is the ErrorInfo reason of err's status ("" for none).
func reasonOf(err error) string {
	for _, d := range status.Convert(err).Details() {
		if e, ok := d.(*errdetails.ErrorInfo); ok {
			return e.Reason
		}
	}
	return ""
}

// retryOf is the RetryInfo delay of err's status (0 for none).
func retryOf(err error) time.Duration {
	for _, d := range status.Convert(err).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			return r.RetryDelay.AsDuration()
		}
	}
	return 0
}

// TestRateHoldsAcrossTwoServers: two servers, each with its own pool on
// one database, share one rate: 40 calls at once, alternating between
// them, admit exactly the burst (10; the rate of 5 an hour adds nothing
// within the test), and every refusal is ResourceExhausted with a wait.
func TestRateHoldsAcrossTwoServers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	u := pgtest.URL(t)
	policy := ratelimit.Policy{Name: "per-tenant", Limit: 5, Window: time.Hour, Burst: 10}
	var clients []healthpb.HealthClient
	for range 2 {
		l := newRate(t, pgtest.Pool(t, u, 4), ratelimit.Options{Policies: []ratelimit.Policy{policy}})
		clients = append(clients, serve(t, nil, must(pglimitgrpc.RateLimit(l, pglimitgrpc.Options{Key: tenant}))))
	}
	const calls = 40
	var (
		mu       sync.Mutex
		admitted = map[int]int{}
		refused  int
		wg       sync.WaitGroup
	)
	for n := range calls {
		wg.Go(func() {
			_, err := clients[n%2].Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				admitted[n%2]++
			case status.Code(err) == codes.ResourceExhausted && reasonOf(err) == "too-many-requests" && retryOf(err) > 0:
				refused++
			default:
				t.Errorf("call %d: %v (reason %q, retry %v)", n, err, reasonOf(err), retryOf(err))
			}
		})
	}
	wg.Wait()
	t.Logf("admitted %v, refused %d", admitted, refused)
	if got := admitted[0] + admitted[1]; got != 10 || refused != calls-10 {
		t.Errorf("admitted %d (by server %v) and refused %d of %d calls; want exactly the burst, 10, admitted", got, admitted, refused, calls)
	}
	// Another tenant has a rate of its own.
	if _, err := clients[1].Check(as(ctx, "globex"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("another tenant: %v", err)
	}
	// A call without the key passes uncounted.
	if _, err := clients[0].Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call without a key: %v", err)
	}
}

// TestStreamHoldsInFlightSlot: a stream on one server holds its token's
// only slot until it ends; while it runs, a call of the token on the other
// server is refused (and the slot's row is in request_in_flight, read by
// the test on its own connection); once it ended, the call passes.
func TestStreamHoldsInFlightSlot(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	u := pgtest.URL(t)
	observer := pgtest.Pool(t, u, 1)
	end := make(chan struct{})
	svc := &health{watch: func(s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
		if err := s.Send(&healthpb.HealthCheckResponse{Status: healthpb.HealthCheckResponse_SERVING}); err != nil {
			return err
		}
		<-end
		return nil
	}}
	var clients []healthpb.HealthClient
	for range 2 {
		l, err := inflight.New(pgtest.Pool(t, u, 4), inflight.Options{Key: noHTTP, Limit: 1, MaxDuration: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, serve(t, svc, must(pglimitgrpc.InFlight(l, pglimitgrpc.Options{Key: tenant}))))
	}
	held := func() int {
		var n int
		if err := observer.QueryRow(ctx, `SELECT count(*) FROM pglimit.request_in_flight WHERE holder = 'acme' AND expires_at > now()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}

	stream, err := clients[0].Watch(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatalf("the stream's first message: %v", err)
	}
	if n := held(); n != 1 {
		t.Errorf("while the stream runs request_in_flight holds %d slots of the token; want 1", n)
	}
	_, err = clients[1].Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "too-many-requests-in-flight" || retryOf(err) < time.Second {
		t.Errorf("a call while the stream runs: %v (reason %q, retry %v); want ResourceExhausted too-many-requests-in-flight with a wait",
			err, reasonOf(err), retryOf(err))
	}
	// A second stream is refused the same way.
	s2, err := clients[1].Watch(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = s2.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a second stream while the first runs: %v; want ResourceExhausted", err)
	}

	close(end)
	if _, err := stream.Recv(); err != io.EOF {
		t.Fatalf("the stream's end: %v; want EOF", err)
	}
	if n := held(); n != 0 {
		t.Errorf("after the stream ended request_in_flight holds %d slots of the token; want 0", n)
	}
	if _, err := clients[1].Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a call after the stream ended: %v", err)
	}
}

// TestHeavyBoundIsDeadline: a heavy call, unary or stream, whose handler
// outlives the endpoint's time bound ends DeadlineExceeded with the reason
// heavy-request-timed-out, its handler having had the bounds in its
// context; an unidentified call runs under the bound as well, and a call
// of another method is not bounded.
func TestHeavyBoundIsDeadline(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool, _ := pgtest.NewDB(t, 4)
	l, err := heavy.New(pool, heavy.Options{Name: "export", Key: noHTTP, Limit: 1, Time: 300 * time.Millisecond, Rows: 10})
	if err != nil {
		t.Fatal(err)
	}
	bounds := make(chan heavy.Bounds, 10)
	svc := &health{
		check: func(ctx context.Context) error {
			b, _ := heavy.FromContext(ctx)
			bounds <- b
			<-ctx.Done()
			return ctx.Err()
		},
		watch: func(s grpc.ServerStreamingServer[healthpb.HealthCheckResponse]) error {
			b, _ := heavy.FromContext(s.Context())
			bounds <- b
			if err := s.Send(&healthpb.HealthCheckResponse{}); err != nil {
				return err
			}
			<-s.Context().Done()
			return errors.New("the export stopped: " + s.Context().Err().Error())
		},
	}
	h := must(pglimitgrpc.Heavy(l, pglimitgrpc.Options{Key: tenant, Methods: []string{methodCheck, methodWatch}}))
	client := serve(t, svc, h)

	check := func(name string, ctx context.Context) {
		t.Helper()
		start := time.Now()
		_, err := client.Check(ctx, &healthpb.HealthCheckRequest{})
		took := time.Since(start)
		if status.Code(err) != codes.DeadlineExceeded || reasonOf(err) != "heavy-request-timed-out" {
			t.Errorf("%s: %v (reason %q); want DeadlineExceeded heavy-request-timed-out", name, err, reasonOf(err))
		}
		if took < 300*time.Millisecond {
			t.Errorf("%s ended after %v, before its time bound", name, took)
		}
		if b := <-bounds; b.Endpoint != "export" || b.Rows != 10 || b.Time != 300*time.Millisecond {
			t.Errorf("%s: the handler's bounds are %+v", name, b)
		}
	}
	check("unary", as(ctx, "acme"))
	check("unary without a key", ctx)

	stream, err := client.Watch(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); err != nil {
		t.Fatal(err)
	}
	_, err = stream.Recv()
	if status.Code(err) != codes.DeadlineExceeded || reasonOf(err) != "heavy-request-timed-out" {
		t.Errorf("stream: %v (reason %q); want DeadlineExceeded heavy-request-timed-out", err, reasonOf(err))
	}
	if strings.Contains(status.Convert(err).Message(), "the export stopped") {
		t.Errorf("stream: the handler's error text reached the client: %q", status.Convert(err).Message())
	}
	if b := <-bounds; b.Endpoint != "export" {
		t.Errorf("stream: the handler's bounds are %+v", b)
	}

	// The permit was given back each time: a call of the key is not
	// refused now. And a refusal names the scope: hold the key's one
	// permit with a call, and a second is refused.
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	svc2 := &health{check: func(ctx context.Context) error {
		started <- struct{}{}
		<-release
		return nil
	}}
	l2, err := heavy.New(pool, heavy.Options{Name: "report", Key: noHTTP, Limit: 1, Time: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	c2 := serve(t, svc2, must(pglimitgrpc.Heavy(l2, pglimitgrpc.Options{Key: tenant, Methods: []string{methodCheck}})))
	done := make(chan error, 1)
	go func() {
		_, err := c2.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
		done <- err
	}()
	<-started
	var trailer metadata.MD
	_, err = c2.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{}, grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted || reasonOf(err) != "too-many-heavy-requests" {
		t.Errorf("a second heavy call of the key: %v (reason %q)", err, reasonOf(err))
	}
	if got, want := trailer.Get("ratelimit-policy"), []string{`"report";q=1;qu="concurrent-requests"`}; !cmp.Equal(got, want) {
		t.Errorf("the refusal's ratelimit-policy trailer is %q; want %q", got, want)
	}
	close(release)
	if err := <-done; err != nil {
		t.Errorf("the first heavy call: %v", err)
	}
	// Watch is not one of its methods: not bounded, not counted.
	if _, err := c2.Watch(as(ctx, "acme"), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a method outside Options.Methods: %v", err)
	}
}

// deadDatabase is a pool on a port that accepts connections and closes
// them at once: a database that cannot be reached.
func deadDatabase(t *testing.T) *pgxpool.Pool {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	pool, err := pgxpool.New(context.Background(), "postgres://nobody@"+ln.Addr().String()+"/none?sslmode=disable&connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// TestUnreachableDatabaseIsUnavailable: when the database cannot be
// reached, the rate limit (closed, its default) and the in-flight cap
// answer Unavailable with a wait and no internal text; the rate limit with
// FailOpen lets the call through.
func TestUnreachableDatabaseIsUnavailable(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pool := deadDatabase(t)
	policies := []ratelimit.Policy{{Name: "api", Limit: 5, Window: time.Second}}
	closed := newRate(t, pool, ratelimit.Options{Name: "closed", Policies: policies, Timeout: 2 * time.Second})
	open := newRate(t, pool, ratelimit.Options{Name: "open", Policies: policies, Timeout: 2 * time.Second, FailOpen: true})
	capper, err := inflight.New(pool, inflight.Options{Key: noHTTP, Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		i    *pglimitgrpc.Interceptor
		want codes.Code
	}{
		{"rate, closed", must(pglimitgrpc.RateLimit(closed, pglimitgrpc.Options{Key: tenant})), codes.Unavailable},
		{"rate, FailOpen", must(pglimitgrpc.RateLimit(open, pglimitgrpc.Options{Key: tenant})), codes.OK},
		{"in-flight", must(pglimitgrpc.InFlight(capper, pglimitgrpc.Options{Key: tenant})), codes.Unavailable},
	} {
		client := serve(t, nil, tc.i)
		_, err := client.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
		if status.Code(err) != tc.want {
			t.Errorf("%s: %v; want %v", tc.name, err, tc.want)
			continue
		}
		if tc.want == codes.OK {
			continue
		}
		s := status.Convert(err)
		if reasonOf(err) != "database-unavailable" || retryOf(err) != 5*time.Second {
			t.Errorf("%s: reason %q, retry %v; want database-unavailable, 5s", tc.name, reasonOf(err), retryOf(err))
		}
		if strings.Contains(s.Message(), "127.0.0.1") || strings.Contains(s.Message(), "connect") {
			t.Errorf("%s: the message carries internal text: %q", tc.name, s.Message())
		}
		// The stream interceptor answers the same.
		stream, err := client.Watch(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = stream.Recv()
		}
		if status.Code(err) != codes.Unavailable {
			t.Errorf("%s, stream: %v; want Unavailable", tc.name, err)
		}
	}
}

// TestRateHeaders: an admitted call gets the RateLimit-Policy and
// RateLimit values as header metadata, a refused one as trailers, as the
// HTTP middleware writes its header fields.
func TestRateHeaders(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewDB(t, 4)
	l := newRate(t, pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "api", Limit: 2, Window: time.Hour, Burst: 3}}})
	client := serve(t, nil, must(pglimitgrpc.RateLimit(l, pglimitgrpc.Options{Key: tenant})))
	wantPolicy := []string{`"api";q=2;w=3600;pglimit-burst=3`}
	for n, r := range []string{`"api";r=2;t=1800`, `"api";r=1;t=1800`, `"api";r=0;t=1800`} {
		var header, trailer metadata.MD
		if _, err := client.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer)); err != nil {
			t.Fatalf("call %d: %v", n+1, err)
		}
		if diff := cmp.Diff(map[string][]string{"policy": wantPolicy, "limit": {r}},
			map[string][]string{"policy": header.Get("ratelimit-policy"), "limit": header.Get("ratelimit")}); diff != "" {
			t.Errorf("call %d: header metadata (-want +got):\n%s", n+1, diff)
		}
	}
	var header, trailer metadata.MD
	_, err := client.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{}, grpc.Header(&header), grpc.Trailer(&trailer))
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("the fourth call: %v; want ResourceExhausted", err)
	}
	if diff := cmp.Diff(map[string][]string{"policy": wantPolicy, "limit": {`"api";r=0;t=1800`}},
		map[string][]string{"policy": trailer.Get("ratelimit-policy"), "limit": trailer.Get("ratelimit")}); diff != "" {
		t.Errorf("the refusal's trailers (-want +got):\n%s", diff)
	}
	if d := retryOf(err); d < 29*time.Minute || d > 30*time.Minute {
		t.Errorf("the refusal's RetryInfo is %v; want the time to the next unit, about 30 min", d)
	}
	// A stream of another tenant: its header metadata carries the values.
	stream, err := client.Watch(as(ctx, "globex"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	header, err = stream.Header()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := header.Get("ratelimit"), []string{`"api";r=2;t=1800`}; !cmp.Equal(got, want) {
		t.Errorf("a stream's ratelimit header metadata is %q; want %q", got, want)
	}
	// A refused stream gets them as trailers (the stream spent one unit,
	// two calls the rest).
	for range 2 {
		if _, err := client.Check(as(ctx, "globex"), &healthpb.HealthCheckRequest{}); err != nil {
			t.Fatal(err)
		}
	}
	stream, err = client.Watch(as(ctx, "globex"), &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := stream.Recv(); status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a stream past the burst: %v; want ResourceExhausted", err)
	}
	if got, want := stream.Trailer().Get("ratelimit"), []string{`"api";r=0;t=1800`}; !cmp.Equal(got, want) {
		t.Errorf("a refused stream's ratelimit trailer is %q; want %q", got, want)
	}
}

// TestGoGRPCMiddlewareLimiter: the rate limit, through its public API,
// satisfies go-grpc-middleware/v2's ratelimit.Limiter, so a service that
// has that middleware may put pglimit's rate under it (losing what the
// middleware does not carry: the details, the metadata, Unavailable).
func TestGoGRPCMiddlewareLimiter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewDB(t, 4)
	l := newRate(t, pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "api", Limit: 2, Window: time.Hour}}})
	var limiter grpcratelimit.Limiter = middlewareLimiter{l: l, key: tenant}
	client := serveWith(t, nil, grpc.ChainUnaryInterceptor(grpcratelimit.UnaryServerInterceptor(limiter)))
	var got []codes.Code
	for range 3 {
		_, err := client.Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
		got = append(got, status.Code(err))
	}
	if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; !cmp.Equal(got, want) {
		t.Errorf("three calls under a rate of 2: %v; want %v", got, want)
	}
}

// middlewareLimiter is pglimit's rate limit as go-grpc-middleware/v2's
// ratelimit.Limiter.
type middlewareLimiter struct {
	l   *ratelimit.Limiter
	key pglimitgrpc.KeyFunc
}

// Limit spends a unit of the call's key; a call without a key passes.
func (m middlewareLimiter) Limit(ctx context.Context) error {
	key, err := m.key(ctx)
	if err != nil || key == "" {
		return pglimitgrpc.Status(ctx, err).Err()
	}
	_, err = m.l.Acquire(ctx, key)
	return pglimitgrpc.Status(ctx, err).Err()
}

// TestOptionsChecked: the options are checked once, when the
// interceptors are made.
func TestOptionsChecked(t *testing.T) {
	t.Parallel()
	pool := deadDatabase(t)
	rl := newRate(t, pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "api", Limit: 1, Window: time.Second}}})
	hv, err := heavy.New(pool, heavy.Options{Name: "export", Key: noHTTP})
	if err != nil {
		t.Fatal(err)
	}
	fl, err := inflight.New(pool, inflight.Options{Key: noHTTP})
	if err != nil {
		t.Fatal(err)
	}
	cost := func(context.Context) int { return 2 }
	for name, make := range map[string]func() (*pglimitgrpc.Interceptor, error){
		"rate without a key": func() (*pglimitgrpc.Interceptor, error) { return pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{}) },
		"nil rate Limiter": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.RateLimit(nil, pglimitgrpc.Options{Key: tenant})
		},
		"heavy without methods": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.Heavy(hv, pglimitgrpc.Options{Key: tenant})
		},
		"heavy with a bad name": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.Heavy(hv, pglimitgrpc.Options{Key: tenant, Methods: []string{"Check"}})
		},
		"in-flight with a cost": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.InFlight(fl, pglimitgrpc.Options{Key: tenant, Cost: cost})
		},
		"nil in-flight Limiter": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.InFlight(nil, pglimitgrpc.Options{Key: tenant})
		},
		"nil heavy Limiter": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.Heavy(nil, pglimitgrpc.Options{Key: tenant})
		},
		"in-flight without key": func() (*pglimitgrpc.Interceptor, error) { return pglimitgrpc.InFlight(fl, pglimitgrpc.Options{}) },
		"rate with a bad method": func() (*pglimitgrpc.Interceptor, error) {
			return pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: tenant, Methods: []string{"/a"}})
		},
	} {
		if i, err := make(); err == nil || i != nil {
			t.Errorf("%s: no error", name)
		}
	}
	if _, err := pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: tenant, Cost: cost, Methods: []string{methodCheck}}); err != nil {
		t.Errorf("good options: %v", err)
	}
}
