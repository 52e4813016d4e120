// Package limit holds what the slot limiters (middleware/heavy,
// middleware/inflight, middleware/upload) and the sign-in throttle
// (middleware/signin) decide: a *Refusal, the error of a claim that does
// not fit, the same for all four (which kind of limit, whose scope, its
// limit and when to retry); and a Permit, what the slot limiters grant
// (the sign-in throttle's own signin.Permit also takes the attempt's
// outcome).
//
//	p, err := console.Acquire(ctx, user) // heavy, inflight or upload
//	var refused *limit.Refusal
//	if errors.As(err, &refused) {
//		log.Printf("%s refused by the %s limit %s; retry in %v", user, refused.Scope, refused.Name, refused.RetryAfter)
//	}
//
// The rate (package ratelimit) and calendar quotas (package quota) charge
// amounts and say more of their decision: their refusals are their own
// *ratelimit.LimitError and *quota.LimitError. Every refusal of every
// limiter matches pglimit.ErrLimited.
package limit

import (
	"context"
	"fmt"
	"time"

	"github.com/pglimit/pglimit/internal/vocab"
)

// Refusal is a claim a limit had no room for. Its Error says which limit
// refused and until when; it matches pglimit.ErrLimited.
type Refusal struct {
	// Kind is the kind of limit that refused: "heavy" (a heavy endpoint),
	// "inflight" (requests in flight), "upload" (uploads per window) or
	// "signin" (failed sign-ins).
	Kind string
	// Name is the limit's name (its Options.Name): for a heavy endpoint,
	// the endpoint.
	Name string
	// Scope is whose limit was reached: "user" (a key's cap on one heavy
	// endpoint, or its uploads) or "installation" (all heavy requests of
	// all replicas); "token" (a token's requests in flight); "username" or
	// "address" (the failed sign-ins of a username, or of a client address
	// over every username).
	Scope string
	// Limit is the limit reached: requests at once (heavy, inflight),
	// uploads per Window, failed sign-ins per Window.
	Limit int
	// Window is the window an upload or sign-in limit counts in; 0 for a
	// limit of requests at once.
	Window time.Duration
	// RetryAfter is when a retry can succeed, on the database clock, at
	// least one second (or the whole Window, when that is shorter): when
	// the first request of the scope reaches its time bound (heavy,
	// inflight: most end far sooner), when the oldest upload leaves the
	// window, when the sign-in window lapses.
	RetryAfter time.Duration
}

// Error says which limit refused and until when, for a log line (never
// for a client: the transports write a problem of their own).
func (r *Refusal) Error() string {
	limit := fmt.Sprintf("%d", r.Limit)
	if r.Window > 0 {
		limit += " per " + r.Window.String()
	}
	return fmt.Sprintf("%s: %s: the %s limit of %s is reached; retry in %v", r.Kind, r.Name, r.Scope, limit, r.RetryAfter)
}

// Is reports whether target is pglimit.ErrLimited.
func (r *Refusal) Is(target error) bool { return target == vocab.ErrLimited }

// Permit is a granted claim of a slot limiter (heavy, inflight, upload):
// the slot is held until Release. In dry run a claim the limit would have
// refused is granted without a slot, and its Refusal says so.
type Permit struct {
	release func(context.Context) error // nil when it holds nothing
	refusal *Refusal
}

// NewPermit returns a Permit whose Release calls release, which must be
// safe to call more than once (nil: the Permit holds nothing, as a
// dry-run refusal's), and whose Refusal is refusal (nil when the claim
// fit). pglimit's slot limiters make theirs with it; a test's stand-in
// for one can too.
func NewPermit(release func(context.Context) error, refusal *Refusal) *Permit {
	return &Permit{release: release, refusal: refusal}
}

// Refusal is, in dry run, the refusal this claim would have had: it holds
// no slot. Nil when the claim fits, and on a nil Permit.
func (p *Permit) Refusal() *Refusal {
	if p == nil {
		return nil
	}
	return p.refusal
}

// Release gives the slot back (a heavy request's two permits, in one
// statement) and waits until the database has it back,
// or ctx ends: work answered after it never holds its slot on any replica.
// Give it back when the work ends (heavy, inflight), or when the upload
// failed and must not count (upload: a counted upload keeps its slot
// until it leaves the window). A slot the limiter keeps for the key's
// next claim on this replica (inflight's Options.Keep) stays held, and
// Release returns at once. One that fails is logged, and the slot then
// lapses on its own, as it does when the process is killed before the
// release is sent; one whose ctx ended goes on without the caller (the
// Limiter's Flush waits for it). It is safe on a nil Permit and to call
// more than once.
func (p *Permit) Release(ctx context.Context) error {
	if p == nil || p.release == nil {
		return nil
	}
	return p.release(ctx)
}
