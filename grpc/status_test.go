package pglimitgrpc_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/pglimit/pglimit/clientaddr"
	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
	"github.com/pglimit/pglimit/ratelimit"
)

var (
	rateRefusal = &ratelimit.LimitError{Name: "api", Violated: []string{"per-tenant"}, Limit: 5, RetryAfter: 1500 * time.Millisecond, Cost: 1,
		Policies: []ratelimit.PolicyState{{Policy: ratelimit.Policy{Name: "per-tenant", Limit: 5, Window: time.Minute, Burst: 10}}}}
	rateNever     = &ratelimit.LimitError{Name: "api", Violated: []string{"per-tenant"}, Limit: 5, Cost: 20}
	inflightRefus = &limit.Refusal{Kind: "inflight", Name: "in-flight", Scope: "token", Limit: 8, RetryAfter: 90 * time.Second}
	heavyRefusal  = &limit.Refusal{Kind: "heavy", Name: "sql-console", Scope: "user", Limit: 2, RetryAfter: 30 * time.Second}
	heavyInstall  = &limit.Refusal{Kind: "heavy", Name: "sql-console", Scope: "installation", Limit: 4, RetryAfter: 10 * time.Second}
	uploadRefusal = &limit.Refusal{Kind: "upload", Name: "uploads", Scope: "user", Limit: 5, Window: time.Hour, RetryAfter: 20 * time.Minute}
	signInRefusal = &limit.Refusal{Kind: "signin", Name: "sign-in", Scope: "address", Limit: 20, Window: 15 * time.Minute, RetryAfter: 14 * time.Minute}
)

// TestStatusTable: each error a limiter's decision returns, as a gRPC
// status: its code, its ErrorInfo reason, its RetryInfo, its QuotaFailure
// subjects, and never the internal text of an error.
func TestStatusTable(t *testing.T) {
	t.Parallel()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	expired, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	bounded, cancel3 := heavy.NewContext(context.Background(), heavy.Bounds{Endpoint: "export", Time: 30 * time.Second})
	defer cancel3()
	secret := errors.New("password authentication failed for user secret-user at 10.1.2.3")
	type want struct {
		Code     codes.Code
		Reason   string
		Retry    time.Duration
		Subjects []string
		Meta     map[string]string
	}
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want want
	}{
		{"nil", nil, nil, want{Code: codes.OK}},
		{"a status already", nil, status.Error(codes.PermissionDenied, "no"), want{Code: codes.PermissionDenied}},
		{"rate refusal", nil, rateRefusal, want{codes.ResourceExhausted, "too-many-requests", 1500 * time.Millisecond, []string{"per-tenant"},
			map[string]string{"limit_name": "api", "limit": "5", "violated_policies": "per-tenant"}}},
		{"rate refusal, wrapped", nil, fmt.Errorf("checkout: %w", rateRefusal), want{codes.ResourceExhausted, "too-many-requests", 1500 * time.Millisecond, []string{"per-tenant"},
			map[string]string{"limit_name": "api", "limit": "5", "violated_policies": "per-tenant"}}},
		{"rate: can never pass", nil, rateNever, want{codes.ResourceExhausted, "too-many-requests", 0, []string{"per-tenant"},
			map[string]string{"limit_name": "api", "limit": "5", "violated_policies": "per-tenant"}}},
		{"in-flight refusal", nil, inflightRefus, want{codes.ResourceExhausted, "too-many-requests-in-flight", 90 * time.Second, []string{"token"},
			map[string]string{"limit_name": "in-flight", "limit": "8", "scope": "token"}}},
		{"heavy refusal, user", nil, heavyRefusal, want{codes.ResourceExhausted, "too-many-heavy-requests", 30 * time.Second, []string{"user"},
			map[string]string{"endpoint": "sql-console", "limit": "2", "scope": "user"}}},
		{"heavy refusal, installation", nil, heavyInstall, want{codes.ResourceExhausted, "too-many-heavy-requests", 10 * time.Second, []string{"installation"},
			map[string]string{"endpoint": "sql-console", "limit": "4", "scope": "installation"}}},
		{"upload refusal", nil, uploadRefusal, want{codes.ResourceExhausted, "too-many-uploads", 20 * time.Minute, []string{"user"},
			map[string]string{"limit_name": "uploads", "limit": "5", "scope": "user"}}},
		{"sign-in refusal", nil, signInRefusal, want{codes.ResourceExhausted, "too-many-failed-sign-ins", 14 * time.Minute, []string{"address"},
			map[string]string{"limit_name": "sign-in", "limit": "20", "scope": "address"}}},
		{"a refusal of a kind the front does not know", nil, &limit.Refusal{Kind: "custom", Name: "c", Scope: "user", Limit: 3, RetryAfter: time.Second},
			want{codes.ResourceExhausted, "too-many-requests", time.Second, []string{"user"}, map[string]string{"limit_name": "c", "limit": "3", "scope": "user"}}},
		{"heavy time bound", bounded, fmt.Errorf("report: %w", heavy.ErrTimedOut), want{Code: codes.DeadlineExceeded, Reason: "heavy-request-timed-out",
			Meta: map[string]string{"endpoint": "export", "bound": "TIME", "limit": "30s"}}},
		{"client gone", nil, context.Canceled, want{Code: codes.Canceled}},
		{"client gone, the connection closed under it", canceled, secret, want{Code: codes.Canceled}},
		{"the call's deadline", expired, context.DeadlineExceeded, want{Code: codes.DeadlineExceeded}},
		{"database shutting down", nil, &pgconn.PgError{Code: "57P01", Message: "terminating connection due to administrator command"},
			want{Code: codes.Unavailable, Reason: "database-unavailable", Retry: 5 * time.Second}},
		{"statement timeout", nil, &pgconn.PgError{Code: "57014", Message: "canceling statement due to statement timeout"},
			want{Code: codes.Unavailable, Reason: "database-unavailable", Retry: 5 * time.Second}},
		{"a failed connect", nil, &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("connection refused")},
			want{Code: codes.Unavailable, Reason: "database-unavailable", Retry: 5 * time.Second}},
		{"anything else", nil, secret, want{Code: codes.Internal, Reason: "internal-error"}},
		{"an invalid policy", nil, fmt.Errorf("%w: policy 1: name %q", ratelimit.ErrInvalidPolicy, "secret-user"), want{Code: codes.Internal, Reason: "internal-error"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := tc.ctx
			if ctx == nil {
				ctx = context.Background()
			}
			s := pglimitgrpc.Status(ctx, tc.err)
			got := want{Code: s.Code()}
			for _, d := range s.Details() {
				switch d := d.(type) {
				case *errdetails.ErrorInfo:
					got.Reason, got.Meta = d.Reason, d.Metadata
					if d.Domain != "pglimit" {
						t.Errorf("ErrorInfo domain %q", d.Domain)
					}
				case *errdetails.RetryInfo:
					got.Retry = d.RetryDelay.AsDuration()
				case *errdetails.QuotaFailure:
					for _, v := range d.Violations {
						got.Subjects = append(got.Subjects, v.Subject)
						if v.Description == "" {
							t.Errorf("violation %q has no description", v.Subject)
						}
					}
				default:
					t.Errorf("a detail of type %T", d)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
			if m := s.Message(); strings.Contains(m, "secret") || strings.Contains(m, "10.1.2.3") || strings.Contains(m, "terminating") {
				t.Errorf("the message carries internal text: %q", m)
			}
			if tc.err != nil && s.Code() == codes.OK {
				t.Errorf("an error became OK")
			}
		})
	}
}

// TestSlugsMatchHTTP: every ErrorInfo reason of a refusal or a failure is
// the problem type slug the HTTP front answers the same error with, and
// its RetryInfo is the HTTP answer's Retry-After (whole seconds, rounded
// up), so a client matches one set of names over both transports.
func TestSlugsMatchHTTP(t *testing.T) {
	t.Parallel()
	bounded, cancel := heavy.NewContext(context.Background(), heavy.Bounds{Endpoint: "export", Time: 30 * time.Second})
	defer cancel()
	unavailable := &pgconn.PgError{Code: "57P01"}
	for _, tc := range []struct {
		name  string
		write func(http.ResponseWriter, *http.Request, error)
		err   error
	}{
		{"rate refusal", mratelimit.WriteError, rateRefusal},
		{"rate unavailable", mratelimit.WriteError, unavailable},
		{"rate internal", mratelimit.WriteError, errors.New("x")},
		{"in-flight refusal", inflight.WriteError, inflightRefus},
		{"in-flight unavailable", inflight.WriteError, unavailable},
		{"heavy refusal", heavy.WriteError, heavyRefusal},
		{"heavy installation", heavy.WriteError, heavyInstall},
		{"heavy timed out", heavy.WriteError, heavy.ErrTimedOut},
		{"heavy unavailable", heavy.WriteError, unavailable},
		{"upload refusal", upload.WriteError, uploadRefusal},
		{"sign-in refusal", signin.WriteError, signInRefusal},
	} {
		rec := httptest.NewRecorder()
		tc.write(rec, httptest.NewRequestWithContext(bounded, "POST", "/x", nil), tc.err)
		var body struct{ Type string }
		if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		slug := body.Type[strings.LastIndex(body.Type, ":")+1:]
		s := pglimitgrpc.Status(bounded, tc.err)
		if r := reasonOf(s.Err()); r != slug {
			t.Errorf("%s: ErrorInfo reason %q, HTTP problem type %q", tc.name, r, body.Type)
		}
		if ra := rec.Header().Get("Retry-After"); ra != "" {
			var secs int
			fmt.Sscan(ra, &secs)
			if d := retryOf(s.Err()); d <= time.Duration(secs-1)*time.Second || d > time.Duration(secs)*time.Second {
				t.Errorf("%s: RetryInfo %v, HTTP Retry-After %s", tc.name, d, ra)
			}
		}
	}
}

// TestClientAddrKey: the key is the peer's address, normalised (IPv6 by
// its /64), or the one a trusted proxy forwarded in the metadata; a call
// without an IP peer has none. And end to end: calls over loopback are
// counted against 127.0.0.1.
func TestClientAddrKey(t *testing.T) {
	t.Parallel()
	behind, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		t.Fatal(err)
	}
	behindFwd, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"10.0.0.0/8"}, Header: "Forwarded"})
	if err != nil {
		t.Fatal(err)
	}
	tcp := func(s string) net.Addr { return net.TCPAddrFromAddrPort(mustAddrPort(t, s)) }
	for _, tc := range []struct {
		name   string
		r      *clientaddr.Resolver
		addr   net.Addr
		md     metadata.MD
		want   string
		wantOK bool
		noPeer bool
		// unreadable: the call is refused InvalidArgument
		// (clientaddr.ErrUnreadable), with no key.
		unreadable bool
	}{
		{name: "IPv4 peer", addr: tcp("192.0.2.7:5555"), want: "192.0.2.7", wantOK: true},
		{name: "IPv6 peer, its /64", addr: tcp("[2001:db8:1:2:3:4:5:6]:443"), want: "2001:db8:1:2::/64", wantOK: true},
		{name: "IPv4-mapped", addr: tcp("[::ffff:192.0.2.9]:1"), want: "192.0.2.9", wantOK: true},
		{name: "forwarded by an untrusted peer: ignored", addr: tcp("192.0.2.7:5555"), md: metadata.Pairs("x-forwarded-for", "203.0.113.9"), want: "192.0.2.7", wantOK: true},
		{name: "forwarded by a trusted proxy", r: behind, addr: tcp("10.1.1.1:5555"), md: metadata.Pairs("x-forwarded-for", "198.51.100.1, 203.0.113.9, 10.2.2.2"), want: "203.0.113.9", wantOK: true},
		{name: "Forwarded by a trusted proxy", r: behindFwd, addr: tcp("10.1.1.1:5555"), md: metadata.Pairs("forwarded", `for="[2001:db8::1]:80"`), want: "2001:db8::/64", wantOK: true},
		{name: "garbage forwarded: refused, no key", r: behind, addr: tcp("10.1.1.1:5555"), md: metadata.Pairs("x-forwarded-for", "unknown"), unreadable: true},
		{name: "the proxy's own call: the proxy", r: behind, addr: tcp("10.1.1.1:5555"), want: "10.1.1.1", wantOK: true},
		{name: "a forwarded the client added never read", r: behind, addr: tcp("10.1.1.1:5555"), md: metadata.Pairs("forwarded", "for=1.1.1.1", "x-forwarded-for", "203.0.113.9"), want: "203.0.113.9", wantOK: true},
		{name: "a Unix socket", addr: &net.UnixAddr{Name: "/run/x.sock", Net: "unix"}},
		{name: "no peer", noPeer: true},
	} {
		ctx := context.Background()
		if !tc.noPeer {
			ctx = peer.NewContext(ctx, &peer.Peer{Addr: tc.addr})
		}
		if tc.md != nil {
			ctx = metadata.NewIncomingContext(ctx, tc.md)
		}
		got, err := pglimitgrpc.ClientAddr(tc.r)(ctx)
		if tc.unreadable {
			if got != "" || status.Code(pglimitgrpc.Status(ctx, err).Err()) != codes.InvalidArgument {
				t.Errorf("%s: %q, %v; want no key and InvalidArgument", tc.name, got, err)
			}
			continue
		}
		if ok := got != ""; got != tc.want || ok != tc.wantOK || err != nil {
			t.Errorf("%s: %q, %v; want %q, %v", tc.name, got, err, tc.want, tc.wantOK)
		}
	}
	if key, err := pglimitgrpc.MetadataKey("x-tenant")(metadata.NewIncomingContext(context.Background(), metadata.Pairs("X-Tenant", "acme"))); key != "acme" || err != nil {
		t.Errorf("MetadataKey: %q, %v", key, err)
	}
	if key, err := pglimitgrpc.MetadataKey("x-tenant")(context.Background()); key != "" || err != nil {
		t.Errorf("MetadataKey without metadata: %q, %v", key, err)
	}
}

// TestClientAddrKeyEndToEnd: over loopback, the calls of one client are
// counted against its address, on a real server.
func TestClientAddrKeyEndToEnd(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, _ := pgtest.NewDB(t, 4)
	l := newRate(t, pool, ratelimit.Options{Policies: []ratelimit.Policy{{Name: "per-address", Limit: 1, Window: time.Hour, Burst: 2}}})
	client := serve(t, nil, must(pglimitgrpc.RateLimit(l, pglimitgrpc.Options{Key: pglimitgrpc.ClientAddr(nil)})))
	var got []codes.Code
	for range 3 {
		_, err := client.Check(as(ctx, fmt.Sprint(time.Now().UnixNano())), &healthpb.HealthCheckRequest{})
		got = append(got, status.Code(err))
	}
	if want := []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted}; !cmp.Equal(got, want) {
		t.Errorf("three calls of one address under a burst of 2: %v; want %v", got, want)
	}
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM pglimit.api_request_window WHERE name = 'api'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("api_request_window has %d keys of the limiter; want 1, the address", n)
	}
}

func mustAddrPort(t *testing.T, s string) netip.AddrPort {
	t.Helper()
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		t.Fatal(err)
	}
	return ap
}
