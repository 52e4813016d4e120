package ratelimit

// GeneralOnly makes l decide with APIRequestWindowDecide alone, so tests
// hold both statements to the same model.
func GeneralOnly(l *Limiter) { l.generalOnly = true }
