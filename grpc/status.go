package pglimitgrpc

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// Domain is the ErrorInfo domain of every status Status makes.
const Domain = "pglimit"

// The problem type slugs the HTTP fronts answer with (problem.TypeBase +
// slug), sent as ErrorInfo reasons so a client matches the same names
// over both transports. TestSlugsMatchHTTP holds them to the HTTP answers.
const (
	slugRate        = "too-many-requests"
	slugInFlight    = "too-many-requests-in-flight"
	slugHeavy       = "too-many-heavy-requests"
	slugUploads     = "too-many-uploads"
	slugSignIns     = "too-many-failed-sign-ins"
	slugTimedOut    = "heavy-request-timed-out"
	slugUnavailable = "database-unavailable"
	slugInternal    = "internal-error"
	slugAddress     = "client-address-unreadable"
)

// unavailableRetry is the wait a database that cannot decide asks for, as
// the HTTP fronts' 503 Retry-After says.
const unavailableRetry = 5 * time.Second

// Status is the gRPC status of err, an error of a pglimit limiter's
// decision (or one a heavy handler got from heavy.Read or heavy.Stream);
// ctx is the call's. Internal error text never reaches the status:
//
//   - nil: OK;
//   - a gRPC status error: itself;
//   - a refusal (*ratelimit.LimitError, *limit.Refusal):
//     ResourceExhausted with ErrorInfo (domain "pglimit", reason the HTTP
//     problem type slug: too-many-requests, too-many-requests-in-flight,
//     too-many-heavy-requests, too-many-uploads,
//     too-many-failed-sign-ins), QuotaFailure (subject: the violated
//     policy, or the scope — token, user, installation, username,
//     address) and RetryInfo (the wait; none for a rate-limited call that
//     can never pass);
//   - heavy.ErrTimedOut: DeadlineExceeded, reason heavy-request-timed-out;
//   - clientaddr.ErrUnreadable (a trusted proxy's header named no client
//     address): InvalidArgument, reason client-address-unreadable;
//   - a call whose ctx was canceled, or pglimit.ClassCanceled: Canceled;
//   - a call whose own deadline passed: DeadlineExceeded;
//   - a database that cannot be reached or did not answer in time
//     (pglimit.ClassUnavailable, ClassTimeout): Unavailable with RetryInfo
//     (5 s), reason database-unavailable;
//   - anything else: Internal, reason internal-error, with no text of err.
func Status(ctx context.Context, err error) *status.Status {
	if err == nil {
		return status.New(codes.OK, "")
	}
	if s, ok := status.FromError(err); ok {
		return s
	}
	var (
		rl *ratelimit.LimitError
		lr *limit.Refusal
	)
	switch {
	case errors.As(err, &rl):
		msg := fmt.Sprintf("rate limit %s: no room in policy %s; retry in %v", rl.Name, strings.Join(rl.Violated, ", "), rl.RetryAfter)
		if rl.RetryAfter == 0 {
			msg = fmt.Sprintf("rate limit %s: a call of cost %d can never pass policy %s", rl.Name, rl.Cost, strings.Join(rl.Violated, ", "))
		}
		q := &errdetails.QuotaFailure{}
		for _, name := range rl.Violated {
			q.Violations = append(q.Violations, &errdetails.QuotaFailure_Violation{
				Subject: name, Description: policyText(rl, name)})
		}
		return withDetails(codes.ResourceExhausted, msg, rl.RetryAfter, slugRate, map[string]string{
			"limit_name": rl.Name, "limit": strconv.Itoa(rl.Limit), "violated_policies": strings.Join(rl.Violated, ","),
		}, q)
	case errors.As(err, &lr):
		return refusalStatus(lr)
	case errors.Is(err, clientaddr.ErrUnreadable):
		return withDetails(codes.InvalidArgument, "the forwarded header names no client address past the trusted proxies",
			0, slugAddress, nil)
	case errors.Is(err, heavy.ErrTimedOut):
		b, _ := heavy.FromContext(ctx)
		return timeBoundStatus(b)
	case ctx != nil && errors.Is(ctx.Err(), context.Canceled), pglimit.Classify(err) == pglimit.ClassCanceled:
		return status.New(codes.Canceled, "the call was canceled")
	case ctx != nil && errors.Is(ctx.Err(), context.DeadlineExceeded):
		return status.New(codes.DeadlineExceeded, "the call's deadline passed")
	case isUnavailable(err):
		return withDetails(codes.Unavailable, "the database cannot be reached; try again shortly",
			unavailableRetry, slugUnavailable, nil)
	}
	return withDetails(codes.Internal, "the server could not complete the call; it has been logged", 0, slugInternal, nil)
}

// refusalStatus is the ResourceExhausted of a slot limiter's or the
// sign-in throttle's refusal r, by its Kind.
func refusalStatus(r *limit.Refusal) *status.Status {
	capText := strconv.Itoa(r.Limit)
	violation := func(desc string) *errdetails.QuotaFailure {
		return &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{Subject: r.Scope, Description: desc}}}
	}
	switch r.Kind {
	case "inflight":
		return withDetails(codes.ResourceExhausted,
			fmt.Sprintf("in-flight limit %s: %d calls in flight already; retry when one ends", r.Name, r.Limit),
			r.RetryAfter, slugInFlight, map[string]string{"limit_name": r.Name, "limit": capText, "scope": r.Scope},
			violation(fmt.Sprintf("%d calls in flight at once", r.Limit)))
	case "heavy":
		return withDetails(codes.ResourceExhausted,
			fmt.Sprintf("heavy endpoint %s: %s limit of %d reached; retry when one ends", r.Name, r.Scope, r.Limit),
			r.RetryAfter, slugHeavy, map[string]string{"endpoint": r.Name, "limit": capText, "scope": r.Scope},
			violation(fmt.Sprintf("%d %s calls at once", r.Limit, r.Name)))
	case "upload":
		return withDetails(codes.ResourceExhausted,
			fmt.Sprintf("upload limit %s: %d uploads per %v already; retry when the oldest leaves the window", r.Name, r.Limit, r.Window),
			r.RetryAfter, slugUploads, map[string]string{"limit_name": r.Name, "limit": capText, "scope": r.Scope},
			violation(fmt.Sprintf("%d uploads per %v", r.Limit, r.Window)))
	case "signin":
		return withDetails(codes.ResourceExhausted,
			fmt.Sprintf("sign-in throttle %s: %d failed sign-ins of the %s; retry after the window", r.Name, r.Limit, r.Scope),
			r.RetryAfter, slugSignIns, map[string]string{"limit_name": r.Name, "limit": capText, "scope": r.Scope},
			violation(fmt.Sprintf("%d failed sign-ins per %v", r.Limit, r.Window)))
	}
	// A kind this front does not know (a Refusal made by hand): the rate
	// limit's reason, the most general.
	return withDetails(codes.ResourceExhausted, fmt.Sprintf("%s limit %s reached; retry in %v", r.Kind, r.Name, r.RetryAfter),
		r.RetryAfter, slugRate, map[string]string{"limit_name": r.Name, "limit": capText, "scope": r.Scope},
		violation(fmt.Sprintf("a limit of %d", r.Limit)))
}

// timeBoundStatus is the DeadlineExceeded of a heavy call stopped at its
// time bound b.
func timeBoundStatus(b heavy.Bounds) *status.Status {
	return withDetails(codes.DeadlineExceeded,
		fmt.Sprintf("heavy endpoint %s: stopped at its time bound of %v", b.Endpoint, b.Time), 0, slugTimedOut,
		map[string]string{"endpoint": b.Endpoint, "bound": heavy.BoundTime, "limit": b.Time.String()})
}

// withDetails is a status of code and msg with ErrorInfo (reason slug,
// metadata meta), RetryInfo when retry is positive, and more.
func withDetails(code codes.Code, msg string, retry time.Duration, slug string, meta map[string]string, more ...protoadapt.MessageV1) *status.Status {
	details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: slug, Domain: Domain, Metadata: meta}}
	if retry > 0 {
		details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(retry)})
	}
	details = append(details, more...)
	s := status.New(code, msg)
	if d, err := s.WithDetails(details...); err == nil {
		return d
	}
	return s
}

// policyText describes the policy named name of the refusal e.
func policyText(e *ratelimit.LimitError, name string) string {
	for _, p := range e.Policies {
		if p.Name == name {
			burst := p.Burst
			if burst == 0 {
				burst = p.Limit
			}
			return fmt.Sprintf("%d per %v, burst %d", p.Limit, p.Window, burst)
		}
	}
	return fmt.Sprintf("a call of cost %d is above its burst", e.Cost)
}

// The metadata keys of the RateLimit values (lower case, as gRPC
// metadata has them).
const (
	mdPolicy    = "ratelimit-policy"
	mdRateLimit = "ratelimit"
)

// headerMD is the RateLimit-Policy and RateLimit fields of h as metadata
// (nil when h has none).
func headerMD(h http.Header) metadata.MD {
	policy, limit := h.Values("RateLimit-Policy"), h.Values("RateLimit")
	if len(policy) == 0 && len(limit) == 0 {
		return nil
	}
	return metadata.MD{mdPolicy: policy, mdRateLimit: limit}
}

// refusalMD is the RateLimit values the HTTP answer to the refusal err has
// (nil for none): the rate limit's, and a heavy endpoint's (written by
// heavy.WriteError itself, so the two fronts never differ).
func refusalMD(err error) metadata.MD {
	var (
		rl *ratelimit.LimitError
		hl *limit.Refusal
	)
	switch {
	case errors.As(err, &rl):
		h := http.Header{}
		mratelimit.SetHeaders(h, rl.Policies)
		return headerMD(h)
	case errors.As(err, &hl) && hl.Kind == "heavy":
		w := &headerOnly{h: http.Header{}}
		heavy.WriteError(w, refusalRequest, hl)
		return headerMD(w.h)
	}
	return nil
}

// refusalRequest stands for the call when an HTTP answer is written only
// for its header fields.
var refusalRequest = &http.Request{Method: http.MethodPost, URL: &url.URL{Path: "/"}, Header: http.Header{}}

// headerOnly is an http.ResponseWriter that keeps the header fields and
// drops the body.
type headerOnly struct{ h http.Header }

func (w *headerOnly) Header() http.Header         { return w.h }
func (w *headerOnly) Write(b []byte) (int, error) { return len(b), nil }
func (w *headerOnly) WriteHeader(int)             {}
