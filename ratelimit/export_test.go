package ratelimit

import "time"

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

// ShareLease sets how long l's share leases run (the tests' shorter
// leases; the production one is 10 s).
func ShareLease(l *Limiter, d time.Duration) { l.shares.lease.SetLease(d, d) }

// Spending reports whether l holds a share and may spend it now (it claims
// or renews one in the background as a decision would).
func Spending(l *Limiter) bool {
	_, ok := l.shares.lease.Spendable(time.Now())
	return ok
}

// ShareOf is a share of p among slots shares (units at once, and the time
// of one more), and ok false when p has none.
func ShareOf(p Policy, slots int) (int64, time.Duration, bool) { return shareOf(p, slots) }

// Reduced is ps as the database decides them with slots shares.
func Reduced(ps []Policy, slots int) []Policy { return (&shares{slots: slots}).reduce(ps) }

// Kill stops l as a killed replica stops: it spends no share any more and
// never gives its share back (its lease runs out in the database).
func Kill(l *Limiter) { l.shares.lease.Kill() }
