package permit

// ErrInvalidClaim is matched by the error of a claim that could never be
// granted.
var ErrInvalidClaim = errInvalidClaim
