package ratelimit

// GeneralOnly makes l decide with APIRequestWindowDecide alone, so tests
// hold both statements to the same model.
func GeneralOnly(l *Limiter) { l.generalOnly = true }

// ErrInvalidCost is matched by the error of a negative cost.
var ErrInvalidCost = errInvalidCost

// MaxPolicies bounds the policies of one request.
const MaxPolicies = maxPolicies

// Name is the limit's name.
func (l *Limiter) Name() string { return l.name }
