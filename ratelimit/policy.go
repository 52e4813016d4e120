package ratelimit

import (
	"errors"
	"fmt"
	"time"
)

// maxWindow bounds a Policy's Window.
const maxWindow = 366 * 24 * time.Hour

// maxPolicies bounds the policies of one request.
const maxPolicies = 16

// maxUnits bounds a Policy's Limit and Burst: a million units a window
// (the unit's time is at least a microsecond, the database clock's
// resolution, for a Window of one second).
const maxUnits = 1_000_000

// maxNameLen bounds a limiter's or a policy's name.
const maxNameLen = 64

// Policy is one rate a key is held to: Limit units per Window, with bursts
// of up to Burst units. A request costs one unit unless AcquireN (or
// middleware/ratelimit's Options.Cost) says otherwise.
//
// The rule is GCRA's: in any interval of length L at most
// Burst + Limit × L / Window units are admitted, and a key that was quiet
// for Burst × Window / Limit may spend Burst units at once. The time one
// unit costs (Window / Limit) is rounded up to a whole microsecond, the
// database clock's resolution; for a Window of whole seconds and a Limit
// dividing a million times it, it is exact.
type Policy struct {
	// Name names the policy in the RateLimit-Policy and RateLimit headers,
	// in the problem body's violated-policies and in the database: 1 to 64
	// letters, digits, '.', '_' or '-'. The policies of one request have
	// different names. Required.
	Name string
	// Limit is the sustained number of units allowed per Window (the
	// header's q): 1..1,000,000. Required.
	Limit int
	// Window is the period of Limit (the header's w): a whole number of
	// seconds, from one second to maxWindow. Required.
	Window time.Duration
	// Burst is the most units a key may spend at once: 1..1,000,000.
	// Default Limit.
	Burst int
}

func (p Policy) burst() int {
	if p.Burst == 0 {
		return p.Limit
	}
	return p.Burst
}

// withLimit is p with Limit n (1..maxUnits) and its Burst scaled by the
// same ratio, rounded up, within 1..maxUnits: an override of the limit.
func (p Policy) withLimit(n int) Policy {
	burst := (int64(p.burst())*int64(n) + int64(p.Limit) - 1) / int64(p.Limit)
	p.Limit, p.Burst = n, int(min(max(burst, 1), maxUnits))
	return p
}

// emission is the time one unit costs, in microseconds, rounded up.
func (p Policy) emission() int64 {
	w := p.Window.Microseconds()
	return (w + int64(p.Limit) - 1) / int64(p.Limit)
}

// ErrInvalidPolicy is matched (errors.Is) by every error of a policy that
// cannot be used: from New for Options.Policies, and from a decision for
// the policies AcquireN was given (middleware/ratelimit's PolicyFunc).
var ErrInvalidPolicy = errors.New("ratelimit: invalid policy")

func policyError(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidPolicy}, args...)...)
}

// checkPolicies reports why ps cannot be the policies of one request.
func checkPolicies(ps []Policy) error {
	if len(ps) == 0 {
		return policyError("no policy")
	}
	if len(ps) > maxPolicies {
		return policyError("%d policies, more than %d", len(ps), maxPolicies)
	}
	for i, p := range ps {
		if err := validName(p.Name); err != nil {
			return policyError("policy %d: %v", i+1, err)
		}
		for _, q := range ps[:i] {
			if q.Name == p.Name {
				return policyError("two policies named %q", p.Name)
			}
		}
		if p.Limit < 1 || p.Limit > maxUnits {
			return policyError("policy %q: Limit %d is not within 1..%d", p.Name, p.Limit, maxUnits)
		}
		if p.Window < time.Second || p.Window > maxWindow || p.Window%time.Second != 0 {
			return policyError("policy %q: Window %v is not a whole number of seconds within 1s..%v", p.Name, p.Window, maxWindow)
		}
		if p.Burst < 0 || p.Burst > maxUnits {
			return policyError("policy %q: Burst %d is not within 1..%d (0: Limit)", p.Name, p.Burst, maxUnits)
		}
	}
	return nil
}

// validName reports why s cannot name a limiter or a policy.
func validName(s string) error {
	if s == "" || len(s) > maxNameLen {
		return fmt.Errorf("name %q is not 1..%d characters long", s, maxNameLen)
	}
	for _, c := range []byte(s) {
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("name %q has a character other than letters, digits, '.', '_' and '-'", s)
		}
	}
	return nil
}
