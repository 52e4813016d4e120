// Package pglimitgrpc puts pglimit's limiters in front of a gRPC server:
// unary and stream server interceptors over the same limiters the HTTP
// fronts use (the rate engine ratelimit, middleware/inflight,
// middleware/heavy), so one Limiter may serve an HTTP and a gRPC front of
// one service at once, counted together across every replica.
//
// It is a Go module of its own (github.com/pglimit/pglimit/grpc), so a
// service that only speaks HTTP downloads nothing of gRPC.
//
//	rl, err := ratelimit.New(pool, ratelimit.Options{Policies: policies})
//	rate, err := pglimitgrpc.RateLimit(rl, pglimitgrpc.Options{Key: pglimitgrpc.MetadataKey("x-tenant")})
//	srv := grpc.NewServer(grpc.ChainUnaryInterceptor(rate.Unary()), grpc.ChainStreamInterceptor(rate.Stream()))
//
// The interceptors only translate: the key comes from the call (Options.Key:
// its metadata, its peer), the decision is the Limiter's (AcquireN or
// Acquire, as the HTTP Handler makes it, dry run and fail mode included),
// and its answer is a gRPC status (see Status): a refusal is
// codes.ResourceExhausted with RetryInfo, QuotaFailure and ErrorInfo
// details, a database that cannot decide codes.Unavailable, a heavy call
// stopped at its time bound codes.DeadlineExceeded. The rate limit's
// engine knows nothing of HTTP; the in-flight cap's and the heavy
// endpoint's own Options.Key (a func of *http.Request) is the HTTP front's
// and is not read here: a service with no HTTP front gives one that
// returns false.
//
// # Metadata
//
// An admitted rate-limited call gets the RateLimit-Policy and RateLimit
// values of draft-ietf-httpapi-ratelimit-headers as header metadata
// ("ratelimit-policy", "ratelimit"); a refused call gets them, where the
// HTTP answer has them, as trailer metadata. A stream holds its in-flight
// slot or heavy permits until its handler returns.
package pglimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/slots"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// KeyFunc returns the identity a call is counted against, read from the
// call's context: its metadata (metadata.FromIncomingContext), its peer
// (peer.FromContext; see ClientAddr), its method (grpc.Method). An empty
// key (and a nil error) lets the call through uncounted, as the HTTP
// middlewares do: a limiter is not an authenticator. An error refuses the
// call uncounted with Status(ctx, err) — InvalidArgument for
// clientaddr.ErrUnreadable, a call whose client address cannot be read.
// Never return a raw secret: the key is stored in the database.
type KeyFunc func(ctx context.Context) (key string, err error)

// Options configure the interceptors of one Limiter. Key is required;
// every other field has a default.
type Options struct {
	// Key returns the identity a call is counted against. Required.
	Key KeyFunc
	// Methods are the full method names ("/pkg.Service/Method") the
	// interceptors limit; every other call passes untouched. Default: every
	// call (RateLimit, InFlight). Required for Heavy: a heavy Limiter is
	// one endpoint, as it wraps one route over HTTP.
	Methods []string
	// Policies gives the policies of each call, as
	// ratelimit.Options.PolicyFunc does a request's; nil or none lets the
	// call through uncounted. RateLimit only. Default: the Limiter's
	// Options.Policies.
	Policies func(ctx context.Context, key string) []ratelimit.Policy
	// Cost returns the units a call spends (ratelimit.Options.Cost).
	// RateLimit only. Default 1.
	Cost func(ctx context.Context) int
	// Logger receives decisions that failed for a reason other than a
	// refusal or a client that went away (the database, a policy that
	// cannot be used). Default slog.Default(), taken when the interceptors
	// are made.
	Logger *slog.Logger
}

// Interceptor is one Limiter as gRPC server interceptors. It is safe for
// concurrent use.
type Interceptor struct {
	key     KeyFunc
	methods []string
	log     *slog.Logger
	// quiet is the Limiter logging the incidents of its database itself
	// (the rate limit): only what is Internal is logged here.
	quiet bool
	// admit decides a call: on success it returns the context to run the
	// handler with, the header metadata to send and the function that
	// ends the call (its handler's error in, the call's error out).
	admit func(ctx context.Context, key string) (context.Context, metadata.MD, func(error) error, error)
	// bare runs an unidentified call (nil: as it is).
	bare func(ctx context.Context) (context.Context, context.CancelFunc)
}

func newInterceptor(kind string, opts Options) (*Interceptor, error) {
	if opts.Key == nil {
		return nil, fmt.Errorf("pglimitgrpc: %s: Options.Key is required", kind)
	}
	for _, m := range opts.Methods {
		if !strings.HasPrefix(m, "/") || strings.Count(m, "/") != 2 {
			return nil, fmt.Errorf("pglimitgrpc: %s: Options.Methods: %q is not a full method name (/pkg.Service/Method)", kind, m)
		}
	}
	if kind != "RateLimit" && (opts.Policies != nil || opts.Cost != nil) {
		return nil, fmt.Errorf("pglimitgrpc: %s: Options.Policies and Options.Cost are RateLimit's", kind)
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Interceptor{key: opts.Key, methods: slices.Clone(opts.Methods), log: opts.Logger}, nil
}

// RateLimit returns the interceptors of the rate limit l: a call with a key
// spends Options.Cost units under Options.Policies (l.AcquireN), all or
// nothing. An admitted call runs with the RateLimit headers as header
// metadata; a refused one is ResourceExhausted with them as trailers;
// when the database cannot decide, the call is Unavailable, or, with the
// engine's Options.FailOpen, runs uncounted.
func RateLimit(l *ratelimit.Limiter, opts Options) (*Interceptor, error) {
	if l == nil {
		return nil, errors.New("pglimitgrpc: RateLimit: nil Limiter")
	}
	i, err := newInterceptor("RateLimit", opts)
	if err != nil {
		return nil, err
	}
	i.quiet = true
	policies, cost := opts.Policies, opts.Cost
	i.admit = func(ctx context.Context, key string) (context.Context, metadata.MD, func(error) error, error) {
		var ps []ratelimit.Policy
		if policies != nil {
			if ps = policies(ctx, key); len(ps) == 0 {
				return ctx, nil, nil, nil
			}
		}
		n := 1
		if cost != nil {
			n = cost(ctx)
		}
		p, err := l.AcquireN(ctx, key, n, ps)
		if err != nil {
			return nil, nil, nil, err
		}
		h := http.Header{}
		mratelimit.SetHeaders(h, p.Policies)
		return ctx, headerMD(h), nil, nil
	}
	return i, nil
}

// InFlight returns the interceptors of the in-flight cap l: a call with a
// key holds one of its slots (l.Acquire) until its handler returns — a
// stream until it ends — and runs with its context ending at
// l.MaxDuration. A refused call is ResourceExhausted.
func InFlight(l *inflight.Limiter, opts Options) (*Interceptor, error) {
	if l == nil {
		return nil, errors.New("pglimitgrpc: InFlight: nil Limiter")
	}
	i, err := newInterceptor("InFlight", opts)
	if err != nil {
		return nil, err
	}
	i.admit = func(ctx context.Context, key string) (context.Context, metadata.MD, func(error) error, error) {
		p, err := l.Acquire(ctx, key)
		if err != nil {
			return nil, nil, nil, err
		}
		ctx, cancel := context.WithTimeout(ctx, l.MaxDuration())
		return ctx, nil, func(err error) error {
			cancel()
			release(ctx, p)
			return err
		}, nil
	}
	return i, nil
}

// Heavy returns the interceptors of the heavy endpoint l over the calls of
// Options.Methods: a call with a key holds the endpoint's permits
// (l.Acquire) until its handler returns — a stream until it ends — and
// runs with its context ending at the endpoint's time bound and carrying
// its Bounds (heavy.FromContext, heavy.Read, heavy.Stream work as over
// HTTP). An unidentified call runs under the bounds without a permit. A
// refused call is ResourceExhausted with the RateLimit values as trailers;
// a call whose handler fails once the time bound has passed, or with
// heavy.ErrTimedOut, is DeadlineExceeded.
func Heavy(l *heavy.Limiter, opts Options) (*Interceptor, error) {
	if l == nil {
		return nil, errors.New("pglimitgrpc: Heavy: nil Limiter")
	}
	if len(opts.Methods) == 0 {
		return nil, errors.New("pglimitgrpc: Heavy: Options.Methods is required (the calls of the heavy endpoint)")
	}
	i, err := newInterceptor("Heavy", opts)
	if err != nil {
		return nil, err
	}
	i.bare = func(ctx context.Context) (context.Context, context.CancelFunc) {
		return heavy.NewContext(ctx, l.Bounds())
	}
	i.admit = func(ctx context.Context, key string) (context.Context, metadata.MD, func(error) error, error) {
		p, err := l.Acquire(ctx, key)
		if err != nil {
			return nil, nil, nil, err
		}
		var md metadata.MD
		if e := p.Refusal(); e != nil {
			// Dry run: the values the refusal would have had, no permit.
			md = refusalMD(e)
		}
		bctx, cancel := heavy.NewContext(ctx, l.Bounds())
		return bctx, md, func(err error) error {
			err = timedOut(bctx, err)
			cancel()
			release(ctx, p)
			return err
		}, nil
	}
	return i, nil
}

// timedOut is a heavy handler's error err as the call's: DeadlineExceeded
// when the time bound of bctx has passed (or err is heavy.ErrTimedOut) and
// err is not a status already.
func timedOut(bctx context.Context, err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	if errors.Is(err, heavy.ErrTimedOut) || errors.Is(bctx.Err(), context.DeadlineExceeded) {
		b, _ := heavy.FromContext(bctx)
		return timeBoundStatus(b).Err()
	}
	return err
}

// release gives p back when the call ends, before the call's answer goes
// out, as the HTTP Handlers do: ctx carries the call's answer
// (slots.Answer, put there by decide), so the release waits until it has
// landed, its own round trip or the batch that carries it, for as long as
// the database answers within the Limiter's Timeout, and a client that
// reads the answer before it sends its next call never finds its own slot
// held; a database that does not answer delays the answer once, by less
// than the Timeout, whatever the interceptors nested (the release goes on
// in the background; a failure is logged by the Limiter's Leaser).
func release(ctx context.Context, p interface{ Release(context.Context) error }) {
	_ = p.Release(ctx)
}

// limits reports whether the interceptors limit method.
func (i *Interceptor) limits(method string) bool {
	return len(i.methods) == 0 || slices.Contains(i.methods, method)
}

// decide runs the decision of a call of method: the context to run its
// handler with, the end of the call (nil: nothing to end) and the status
// error of a call that may not run. Header metadata goes out through
// setHeader, a refusal's trailers through setTrailer.
func (i *Interceptor) decide(ctx context.Context, method string, setHeader, setTrailer func(metadata.MD) error) (context.Context, func(error) error, error) {
	if !i.limits(method) {
		return ctx, nil, nil
	}
	// The call's answer, shared by every interceptor around it: their
	// releases come before it (release).
	ctx = slots.Answer(ctx)
	key, err := i.key(ctx)
	if err != nil {
		s := Status(ctx, err)
		if s.Code() == codes.Internal {
			i.log.ErrorContext(ctx, "pglimitgrpc: the key of a call failed", "method", method, "err", err)
		}
		return nil, nil, s.Err()
	}
	if key == "" {
		if i.bare == nil {
			return ctx, nil, nil
		}
		bctx, cancel := i.bare(ctx)
		return bctx, func(err error) error {
			err = timedOut(bctx, err)
			cancel()
			return err
		}, nil
	}
	hctx, md, end, err := i.admit(ctx, key)
	if err != nil {
		if md := refusalMD(err); md != nil {
			_ = setTrailer(md)
		}
		s := Status(ctx, err)
		if c := s.Code(); c != codes.ResourceExhausted && c != codes.Canceled && (!i.quiet || c == codes.Internal) {
			level := slog.LevelWarn
			if c == codes.Internal {
				level = slog.LevelError
			}
			i.log.Log(ctx, level, "pglimitgrpc: decision failed", "method", method, "code", c.String(),
				"class", string(pglimit.Classify(err)), "err", err)
		}
		return nil, nil, s.Err()
	}
	if len(md) > 0 {
		_ = setHeader(md)
	}
	return hctx, end, nil
}

// Unary returns the unary server interceptor.
func (i *Interceptor) Unary() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		set := func(md metadata.MD) error { return grpc.SetHeader(ctx, md) }
		trailer := func(md metadata.MD) error { return grpc.SetTrailer(ctx, md) }
		hctx, end, err := i.decide(ctx, info.FullMethod, set, trailer)
		if err != nil {
			return nil, err
		}
		resp, err := handler(hctx, req)
		if end != nil {
			err = end(err)
		}
		return resp, err
	}
}

// Stream returns the stream server interceptor. A stream holds what its
// decision took until its handler returns.
func (i *Interceptor) Stream() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ctx := ss.Context()
		trailer := func(md metadata.MD) error { ss.SetTrailer(md); return nil }
		hctx, end, err := i.decide(ctx, info.FullMethod, ss.SetHeader, trailer)
		if err != nil {
			return err
		}
		if hctx != ctx {
			ss = &stream{ServerStream: ss, ctx: hctx}
		}
		err = handler(srv, ss)
		if end != nil {
			err = end(err)
		}
		return err
	}
}

// stream is a ServerStream whose handler runs with another context.
type stream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stream) Context() context.Context { return s.ctx }

// isUnavailable reports whether err is a database that cannot be reached
// or did not answer in time.
func isUnavailable(err error) bool {
	c := pglimit.Classify(err)
	return c == pglimit.ClassUnavailable || c == pglimit.ClassTimeout
}
