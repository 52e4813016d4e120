package ratelimit

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/pglimit/pglimit/internal/vocab"
)

// LimitError is a refused request.
type LimitError struct {
	// Name is the limiter's name.
	Name string
	// Violated names the policies that had no room for the request, in the
	// request's order (the problem body's violated-policies).
	Violated []string
	// Limit is the first violated policy's Limit (the problem body's
	// limit).
	Limit int
	// RetryAfter is the time until the request would fit, exact to the
	// microsecond on the database clock, if nothing else is spent
	// meanwhile; 0 when it never can (its cost is above a violated
	// policy's Burst).
	RetryAfter time.Duration
	// Cost is what the request would have spent.
	Cost int
	// Policies are the request's policies and the key's state in them
	// (none when the cost is above a burst: no round trip was made).
	Policies []PolicyState
	// At is when the decision was made, on the database clock (zero when
	// no round trip was made).
	At time.Time
	// Banned is true when the key is banned (Options.Ban): refused
	// without a statement until RetryAfter from now, whatever it spends;
	// Violated, Limit and Policies are then empty.
	Banned bool
}

func (e *LimitError) Error() string {
	if e.Banned {
		return fmt.Sprintf("ratelimit: %s: the key is banned; retry in %v", e.Name, e.RetryAfter)
	}
	if e.RetryAfter == 0 {
		return fmt.Sprintf("ratelimit: %s: a request of cost %d can never pass policies %s (above their burst)",
			e.Name, e.Cost, strings.Join(e.Violated, ", "))
	}
	return fmt.Sprintf("ratelimit: %s: no room in policies %s; retry in %v", e.Name, strings.Join(e.Violated, ", "), e.RetryAfter)
}

// Is reports whether target is pglimit.ErrLimited.
func (e *LimitError) Is(target error) bool { return target == vocab.ErrLimited }

// isCanceled reports whether err ended a decision because the caller's
// context was canceled: a client that went away, not a failure.
func isCanceled(ctx context.Context, err error) bool {
	return vocab.ClassOf(ctx, err) == vocab.ClassCanceled
}

// isUnavailable reports whether err is a database that cannot be reached
// or did not answer in time (pglimit.ClassUnavailable or ClassTimeout).
func isUnavailable(err error) bool {
	c := vocab.Classify(err)
	return c == vocab.ClassUnavailable || c == vocab.ClassTimeout
}
