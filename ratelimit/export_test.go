package ratelimit

// GeneralOnly makes l decide with APIRequestWindowDecide alone, so tests
// hold both statements to the same model.
func GeneralOnly(l *Limiter) { l.generalOnly = true }

// OnShard makes l decide with the statements a Citus cluster runs on a
// key's shard (APIRequestWindowDecideOneOnShard, and the functions of
// APIRequestWindowDecideOnShard and APIRequestWindowBorrowOnShard) on one
// server, so tests hold them to the same model.
func OnShard(l *Limiter) { l.citus.Set(true) }

// MaxPolicies bounds the policies of one request.
const MaxPolicies = maxPolicies
