// Package memo is the bounded table in which a limiter remembers refusals
// that hold until a known time, so that a replica answers them with no
// statement (ratelimit, signin).
//
// A Table answers only while its bus is Live (so it would hear a write
// that undoes a refusal) and only what it remembered in the bus's current
// epoch; it remembers a decision only if no invalidation of its topic
// arrived while the decision's statement ran (Seq before, Remember after).
//
// Bounds: at most Keys keys, in Shards shards of Keys/Shards. A shard that
// is full drops its lapsed entries; if none has lapsed, the new refusal is
// not remembered (that key is decided in the database, as without memory).
//
// Each key's entry also carries a gate: while a key is (or was lately)
// refused, a replica's statements for it take turns, and each request
// looks at the table again once it has the gate, so that when a refusal
// lapses one request asks the database and the others of the key get its
// answer from memory: one statement per replica per refusal period.
package memo

import (
	"hash/maphash"
	"sync"
	"time"

	"github.com/pglimit/pglimit/internal/bus"
)

// Bounds of a Table.
const (
	Keys   = 10000
	Shards = 32
)

// Table remembers values of type V by key until a time on this replica's
// clock. It is safe for concurrent use.
type Table[V any] struct {
	bus    *bus.Bus
	sub    *bus.Subscription
	seed   maphash.Seed
	shards [Shards]shard[V]
}

type shard[V any] struct {
	mu sync.Mutex
	m  map[string]*entry[V]
}

type entry[V any] struct {
	gate  sync.Mutex
	epoch uint64
	set   bool
	until time.Time
	val   V
}

// New makes a Table answering while b is Live and told by sub's
// deliveries (which must call Forget and ForgetAll) what to forget.
func New[V any](b *bus.Bus, sub *bus.Subscription) *Table[V] {
	t := &Table[V]{bus: b, sub: sub, seed: maphash.MakeSeed()}
	for i := range t.shards {
		t.shards[i].m = map[string]*entry[V]{}
	}
	return t
}

func (t *Table[V]) shard(key string) *shard[V] {
	return &t.shards[maphash.String(t.seed, key)%Shards]
}

// Seq is read before a decision's statement and given to Remember.
func (t *Table[V]) Seq() uint64 { return t.sub.Seq() }

// Linger is how long after a value lapses its key's statements still take
// turns at the gate: long enough for the request that asks the database
// again and the next one (refused again, remembered) when the key is
// still hammered; a key that goes quiet stops taking turns.
const Linger = time.Second

// Recall returns key's value, and until when it holds, if it may be used
// at now; gate is key's gate
// while the key has a value that holds or lapsed less than Linger ago, nil
// otherwise.
func (t *Table[V]) Recall(key string, now time.Time) (val V, until time.Time, ok bool, gate *sync.Mutex) {
	sh := t.shard(key)
	sh.mu.Lock()
	e := sh.m[key]
	if e == nil || !e.set || now.Sub(e.until) > Linger {
		sh.mu.Unlock()
		return val, until, false, nil
	}
	ok = now.Before(e.until) && e.epoch == t.bus.Epoch() && t.bus.Live()
	if ok {
		val, until = e.val, e.until
	}
	sh.mu.Unlock()
	return val, until, ok, &e.gate
}

// Remember keeps val for key until until, unless the bus is not Live or an
// invalidation arrived since seq was read.
func (t *Table[V]) Remember(key string, until time.Time, val V, seq uint64) {
	if !t.bus.Live() || t.sub.Seq() != seq {
		return
	}
	epoch := t.bus.Epoch()
	sh := t.shard(key)
	sh.mu.Lock()
	defer sh.mu.Unlock()
	e := sh.m[key]
	if e == nil {
		if len(sh.m) >= Keys/Shards {
			now := time.Now()
			for k, old := range sh.m {
				if !old.set || !now.Before(old.until) || old.epoch != epoch {
					delete(sh.m, k)
				}
			}
			if len(sh.m) >= Keys/Shards {
				return
			}
		}
		e = &entry[V]{}
		sh.m[key] = e
	}
	e.epoch, e.set, e.until, e.val = epoch, true, until, val
}

// Forget drops key's value (its gate stays with whoever holds it), when a
// write undid the refusal: the key's statements stop taking turns.
func (t *Table[V]) Forget(key string) {
	sh := t.shard(key)
	sh.mu.Lock()
	if e := sh.m[key]; e != nil {
		e.set = false
		var zero V
		e.val = zero
	}
	sh.mu.Unlock()
}

// ForgetAll drops every value.
func (t *Table[V]) ForgetAll() {
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		for _, e := range sh.m {
			e.set = false
			var zero V
			e.val = zero
		}
		sh.mu.Unlock()
	}
}

// Len is the number of keys with an entry (tests).
func (t *Table[V]) Len() int {
	n := 0
	for i := range t.shards {
		sh := &t.shards[i]
		sh.mu.Lock()
		n += len(sh.m)
		sh.mu.Unlock()
	}
	return n
}
