package ratelimit

import (
	"context"
	"hash/maphash"
	"sync"
	"time"

	"github.com/pglimit/pglimit/internal/memo"
	share "github.com/pglimit/pglimit/internal/shares"
)

// Shares (Options.Shares): the cold path. Of each policy of every key, a
// twentieth of its burst and of its rate is kept apart in Shares shares
// (default 8), and the database decides the rest: Burst − Shares × c units
// at once and a rate lowered by Shares × c units per Burst × Window /
// Limit, where c, a share's units, is Burst / (20 × Shares) rounded down
// (a policy whose c is 0, or whose lowered Limit would be 0, has no
// shares and is decided in the database whole). A replica that holds one
// of the Shares leases (pglimit.share) spends each key's share in memory,
// as a GCRA of its own — c units at once, one more every Burst × Window /
// (Limit × c) — with no statement; a request its shares cannot admit goes
// to the database, which decides it against what is left. Any interval of
// length L then admits at most, per share, c + the share's rate × L, and
// in the database what is left of the burst and rate: Burst + Limit × L /
// Window in all.
//
// A share is spent by one replica at a time. Its holder stops at its
// lease's end by its own clock (the lease measured from before the
// statement that gave or renewed it, and renewed while requests come); a
// Limiter that takes a share (at its first request, or after it lost its
// lease) spends nothing of it for a lease after its claim, every key's
// share empty then and refilling at its rate, so what a previous holder
// spent — one killed, one cut off from the database, or one whose row a
// database restart emptied — cannot add to what this one spends in the
// same interval. At most Shares replicas spend shares; the others decide
// in the database.
//
// What it costs and buys: a key that sends less than its share's rate to
// a replica (a user who sends one request every few seconds, spread over
// the replicas by a balancer) is decided in memory; a statement only for
// what overflows the share. The price: the database alone admits a
// twentieth less, so a client above 95 % of its limit on one replica may
// be refused a request that one shared counter would have admitted (no
// client at or under 90 % is), and a single request may cost at most what
// the database decides at once, Burst − Shares × c.
const (
	// shareFraction is the part of each policy kept for the shares: 1/20.
	shareFraction = 20
	// defaultShares is Options.Shares' default.
	defaultShares = 8
	// maxShareKeys bounds the keys a Limiter remembers shares of (about
	// 100 bytes each); past it a new key is decided in the database until
	// one whose share refilled is dropped.
	maxShareKeys = 100_000
)

// shares is a Limiter's side of Options.Shares: its lease on a share
// (package internal/shares) and its keys' shares on this replica.
type shares struct {
	l     *Limiter
	slots int
	lease *share.Lease
	seed  maphash.Seed
	keys  [memo.Shards]shareShard
}

type shareShard struct {
	mu sync.Mutex
	m  map[string]*shareKey
}

// shareKey is a key's share on this replica: a TAT per policy, by name.
type shareKey struct {
	names []string
	tats  []time.Time
}

func newShares(l *Limiter, slots int) *shares {
	return &shares{l: l, slots: slots, seed: maphash.MakeSeed(),
		lease: share.New(l.pool, share.Config{Name: "rate:" + l.name, Slots: slots, Timeout: l.timeout})}
}

// shareOf is a share of p among slots shares: c units at once, one more
// every t; ok false when p has none.
func shareOf(p Policy, slots int) (c int64, t time.Duration, ok bool) {
	burst := int64(p.burst())
	c = burst / int64(shareFraction*slots)
	if c < 1 {
		return 0, 0, false
	}
	if lowered(p, slots, c) < 1 {
		return 0, 0, false
	}
	// Burst × Window / (Limit × c), rounded up to a microsecond.
	w := p.Window.Microseconds()
	num, den := burst*w, int64(p.Limit)*c
	return c, time.Duration((num+den-1)/den) * time.Microsecond, true
}

// lowered is the Limit the database decides p by when slots shares of c
// units are kept apart: Limit × (Burst − slots × c) / Burst, rounded down.
func lowered(p Policy, slots int, c int64) int64 {
	burst := int64(p.burst())
	return int64(p.Limit) * (burst - int64(slots)*c) / burst
}

// reduce is ps as the database decides them: each policy with shares
// less its shares' burst and rate (the same Name: the key's row is one).
func (s *shares) reduce(ps []Policy) []Policy {
	var out []Policy
	for i, p := range ps {
		c, _, ok := shareOf(p, s.slots)
		if !ok {
			continue
		}
		if out == nil {
			out = make([]Policy, len(ps))
			copy(out, ps)
		}
		out[i].Burst = p.burst() - s.slots*int(c)
		out[i].Limit = int(lowered(p, s.slots, c))
	}
	if out == nil {
		return ps
	}
	return out
}

// acquire admits a request of cost under policies (as configured, the
// overrides applied) from this replica's shares of key (stored form) at
// now, with no statement, or reports false: the request goes to the
// database. Every policy must have a share with room for cost.
func (s *shares) acquire(key string, cost int, policies []Policy, now time.Time) bool {
	if cost < 1 {
		return false
	}
	var (
		cs [maxPolicies]int64
		ts [maxPolicies]time.Duration
	)
	for i, p := range policies {
		c, t, ok := shareOf(p, s.slots)
		if !ok || int64(cost) > c {
			return false
		}
		cs[i], ts[i] = c, t
	}
	// Only a limiter whose policies have shares takes one.
	from, ok := s.lease.Spendable(now)
	if !ok {
		return false
	}
	sh := &s.keys[maphash.String(s.seed, key)%memo.Shards]
	sh.mu.Lock()
	defer sh.mu.Unlock()
	k := sh.m[key]
	if k == nil {
		if k = sh.newKey(key, now); k == nil {
			return false
		}
	}
	// Every policy first judged, then every one spent: all or nothing.
	var next [maxPolicies]time.Time
	for i, p := range policies {
		// A share is empty at from (c units of its time ahead of it) and
		// refills at its rate: a TAT never earlier than from + c × t.
		tat := from.Add(time.Duration(cs[i]) * ts[i])
		if j := k.index(p.Name); j >= 0 && k.tats[j].After(tat) {
			tat = k.tats[j]
		}
		base := tat
		if now.After(base) {
			base = now
		}
		n := base.Add(time.Duration(cost) * ts[i])
		// Admitted while the TAT after it is at most c units of time
		// ahead of now.
		if n.Sub(now) > time.Duration(cs[i])*ts[i] {
			return false
		}
		next[i] = n
	}
	for i, p := range policies {
		k.set(p.Name, next[i])
	}
	return true
}

// newKey adds key's entry to sh (locked), making room when it is full by
// dropping the entries whose shares have all refilled (their TATs passed:
// as a new entry, which starts full); nil when none could go.
func (sh *shareShard) newKey(key string, now time.Time) *shareKey {
	if sh.m == nil {
		sh.m = map[string]*shareKey{}
	}
	if len(sh.m) >= maxShareKeys/memo.Shards {
		for k, e := range sh.m {
			if e.refilled(now) {
				delete(sh.m, k)
			}
		}
		if len(sh.m) >= maxShareKeys/memo.Shards {
			return nil
		}
	}
	e := &shareKey{}
	sh.m[key] = e
	return e
}

func (k *shareKey) index(name string) int {
	for i, n := range k.names {
		if n == name {
			return i
		}
	}
	return -1
}

func (k *shareKey) set(name string, tat time.Time) {
	if i := k.index(name); i >= 0 {
		k.tats[i] = tat
		return
	}
	k.names = append(k.names, name)
	k.tats = append(k.tats, tat)
}

func (k *shareKey) refilled(now time.Time) bool {
	for _, t := range k.tats {
		if t.After(now) {
			return false
		}
	}
	return true
}

// flush stops spending and gives the share back (Limiter.Flush).
func (s *shares) flush(ctx context.Context) error { return s.lease.Flush(ctx) }
