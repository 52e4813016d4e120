// Package ban refuses, on every replica, a key that a rate limit refused
// too often: a key refused Options.After times within Options.Within is
// banned for Options.For (fail2ban's jail, rack-attack's Allow2Ban). It has no HTTP:
// middleware/ratelimit consults it (ratelimit.Options.Ban) and maps a ban
// to 429 banned; any other caller asks Banned and tells Refused.
//
// # What it guarantees
//
// Banned answers from memory, with no statement, and exactly until the
// ban's time: a ban is a row of the UNLOGGED table pglimit.ban whose end is
// on the database clock, and each replica keeps the live bans in memory,
// mapped to its own clock through its latest statement (the error is the
// statement's way there or back, a millisecond on a local network). A
// replica learns of a ban made by another within about a second (the
// invalidation bus, LISTEN pglimit: the statement that bans is followed by
// a notification), and so of a lift (Lift, an operator's). Whenever its
// bus connects again — when it may have missed a notification — a replica
// reads the live bans again; while its bus is down (or never comes up, as
// behind PgBouncer in transaction pooling) it reads them again at most once
// a second, in the background, while Banned is being asked.
//
// # What it costs
//
// Banned: a map read under a read lock. Refused: one statement
// (sql/queries/ban.sql, BanRefused, an upsert on the key's row) until the
// key is banned, none after; refusals of one key that arrive while this
// replica's statement for it is under way are added up and counted by the
// next statement, so a key hammered past its rate costs each replica one
// statement at a time, and the ban at most After of them per replica. The
// statement that bans sends one notification more. A replica keeps at most
// 100,000 bans in memory (a key is a few hundred bytes at most); past
// that, a new ban is not remembered on this replica, which still refuses
// that key by its rate limit and counts it.
//
// # What it does not do
//
// A key is the caller's (a user, a token's id, a client address, each with
// its own prefix so that none can be another's): a caller that gives a key
// an attacker chooses lets the attacker ban whom they choose. A crash of
// the database empties pglimit.ban: every ban ends. Bans of every Bans of a
// database share one table: one rule (Options) per database.
//
// A Bans is safe for concurrent use.
package ban

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/keys"
)

// Bounds of Options and of a replica's memory.
const (
	maxAfter    = 1_000_000
	minDuration = time.Millisecond
	maxDuration = 366 * 24 * time.Hour
	// maxMemory bounds the bans a replica keeps in memory and reads again.
	maxMemory = 100_000
	// maxList bounds List.
	maxList = 1000
	// refreshEvery is how often, at most, a replica whose bus is down
	// reads the live bans again.
	refreshEvery = time.Second
	// timeout bounds one statement.
	timeout = 5 * time.Second
)

// Options say when a key is banned: refused After times within Within,
// it is banned for For. Every field is required.
type Options struct {
	// After is the refusals that ban: 1 to 1,000,000.
	After int
	// Within is the window the refusals are counted in, opened by the
	// first of them: 1ms to 366 days.
	Within time.Duration
	// For is how long a ban lasts: 1ms to 366 days.
	For time.Duration
}

func (o Options) check() error {
	switch {
	case o.After < 1 || o.After > maxAfter:
		return fmt.Errorf("ban: Options.After %d is not between 1 and %d", o.After, maxAfter)
	case o.Within < minDuration || o.Within > maxDuration:
		return fmt.Errorf("ban: Options.Within %v is not between %v and %v", o.Within, minDuration, maxDuration)
	case o.For < minDuration || o.For > maxDuration:
		return fmt.Errorf("ban: Options.For %v is not between %v and %v", o.For, minDuration, maxDuration)
	}
	return nil
}

// Ban is a key banned, as the database has it.
type Ban struct {
	// Key is the key as stored (the key itself, or "sha256:" and its
	// digest when it is not short UTF-8 text).
	Key string
	// Until is when the ban ends, on the database clock.
	Until time.Time
	// Since is when it began.
	Since time.Time
}

// Bans keeps the bans of one database's keys. It is safe for concurrent
// use.
type Bans struct {
	pool *pgxpool.Pool
	q    *db.Queries
	rule Options
	bus  *bus.Bus
	sub  *bus.Subscription

	mu  sync.RWMutex
	mem map[string]time.Time // stored key → end of its ban on this replica's clock
	// changes counts the bans this replica learnt or forgot itself (under
	// mu): a read of every ban that began before one of them is stale.
	changes uint64

	// offset is the database clock minus this replica's, in nanoseconds,
	// from the latest statement.
	offset   atomic.Int64
	clockMu  sync.Mutex
	clockAt  time.Time     // when offset was estimated
	clockRTT time.Duration // the round trip it was estimated from

	// Reading the live bans again (reload).
	loading  atomic.Bool
	loaded   atomic.Uint64 // the bus epoch of the last read, +1 (0: none)
	lastRead atomic.Int64  // unix nanoseconds of the last read, or try
	failedAt atomic.Int64  // unix nanoseconds of the last failed read

	pmu     sync.Mutex
	pending map[string]*pending // stored key → refusals waiting for a statement
}

// New returns the Bans of pool's database, which must have pglimit's
// schema (pglimit.Migrate), under opts, checked here. It runs no
// statement; pglimit.Run must run for replicas to hear each other's bans
// within a second.
func New(pool *pgxpool.Pool, opts Options) (*Bans, error) {
	if pool == nil {
		return nil, errors.New("ban: nil pool")
	}
	if err := opts.check(); err != nil {
		return nil, err
	}
	b := &Bans{pool: pool, q: db.New(), rule: opts, bus: bus.For(pool),
		mem: map[string]time.Time{}, pending: map[string]*pending{}}
	b.sub = b.bus.Subscribe(bus.TopicBan, b.heard, func() { b.loaded.Store(0) })
	return b, nil
}

// Banned reports whether key is banned now and until when (on this
// replica's clock), from memory: no statement.
func (b *Bans) Banned(_ context.Context, key string) (until time.Time, banned bool) {
	b.refresh()
	return b.recall(keys.Stored(key), time.Now())
}

func (b *Bans) recall(stored string, now time.Time) (time.Time, bool) {
	b.mu.RLock()
	until, ok := b.mem[stored]
	b.mu.RUnlock()
	if ok && now.Before(until) {
		return until, true
	}
	return time.Time{}, false
}

// Refused counts a refusal of key by a rate limit. When the key is
// banned — already, or by this refusal — it returns until when, on this
// replica's clock, with no statement when this replica knew it already.
// Refusals of key that arrive while this replica's statement for it is
// under way are counted by the next one (the same caller's, at most three
// statements in all, or a later refusal's) and return banned false at
// once.
// The statement is not canceled with ctx (a refusal counts even when its
// client went away); it is bounded by 5 s.
func (b *Bans) Refused(ctx context.Context, key string) (until time.Time, banned bool, err error) {
	stored := keys.Stored(key)
	if until, ok := b.recall(stored, time.Now()); ok {
		return until, true, nil
	}
	b.pmu.Lock()
	p := b.pending[stored]
	if p != nil && p.busy {
		p.n++
		b.pmu.Unlock()
		return time.Time{}, false, nil
	}
	if p == nil {
		p = &pending{}
		b.pending[stored] = p
	}
	n := p.n + 1
	p.n, p.busy = 0, true
	b.pmu.Unlock()
	done := func() {
		b.pmu.Lock()
		delete(b.pending, stored)
		b.pmu.Unlock()
	}
	ctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	for round := 1; ; round++ {
		seq := b.sub.Seq()
		sent := time.Now()
		row, err := b.q.BanRefused(ctx, b.pool, &db.BanRefusedParams{Key: stored, N: int32(min(n, maxAfter)), After: int32(b.rule.After),
			WithinUs: b.rule.Within.Microseconds(), ForUs: b.rule.For.Microseconds()})
		if err != nil {
			done()
			return time.Time{}, false, fmt.Errorf("ban: counting a refusal: %w", dberr.OwnTimeout(ctx, err))
		}
		b.setOffset(row.Now, sent, time.Now())
		if row.Banned && row.Until.Valid {
			done()
			until := b.local(row.Until.Time)
			// Remembered only if no ban or lift arrived meanwhile: a lift
			// that ran after this statement must not be undone here. The
			// notification below brings it back otherwise.
			b.remember(stored, until, seq)
			if row.BannedNow {
				msg := bus.TopicBan + "\n" + strconv.FormatInt(row.Until.Time.UnixMicro(), 10) + " " + stored
				if err := b.q.BusNotify(ctx, b.pool, msg); err != nil {
					return until, true, fmt.Errorf("ban: banned, but the replicas were not told: %w", dberr.OwnTimeout(ctx, err))
				}
			}
			return until, true, nil
		}
		b.pmu.Lock()
		switch {
		case p.n == 0:
			delete(b.pending, stored)
		case round == maxRounds:
			// This caller has waited long enough: the next refusal of
			// the key counts what is left, with its own. (Past the bound
			// on keys waiting, what is left is dropped.)
			p.busy = false
			if len(b.pending) > maxMemory {
				delete(b.pending, stored)
			}
		default:
			n, p.n = p.n, 0
			b.pmu.Unlock()
			continue
		}
		b.pmu.Unlock()
		return time.Time{}, false, nil
	}
}

// pending are the refusals of a key waiting for a statement: n counted
// while busy, a caller's statement for the key under way.
type pending struct {
	n    int
	busy bool
}

// maxRounds bounds the statements one Refused runs for the refusals that
// arrive meanwhile.
const maxRounds = 3

// Lift ends key's ban on every replica: its row goes (its count of
// refusals too), this replica forgets it at once and every other within
// about a second (the notification sent after the delete). lifted is false
// when key was not banned.
func (b *Bans) Lift(ctx context.Context, key string) (lifted bool, err error) {
	stored := keys.Stored(key)
	ctx, cancel := dberr.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := b.q.BanLift(ctx, b.pool, stored)
	if err != nil {
		return false, fmt.Errorf("ban: lift: %w", dberr.OwnTimeout(ctx, err))
	}
	b.forget(stored)
	for _, r := range rows {
		lifted = lifted || r
	}
	if !lifted {
		return false, nil
	}
	if err := b.q.BusNotify(ctx, b.pool, bus.TopicBan+"\n- "+stored); err != nil {
		return true, fmt.Errorf("ban: lifted, but the replicas were not told: %w", dberr.OwnTimeout(ctx, err))
	}
	return true, nil
}

// List returns the live bans, latest end first, at most 1,000, read from
// the database.
func (b *Bans) List(ctx context.Context) ([]Ban, error) {
	ctx, cancel := dberr.WithTimeout(ctx, timeout)
	defer cancel()
	rows, err := b.q.BanList(ctx, b.pool, maxList)
	if err != nil {
		return nil, fmt.Errorf("ban: list: %w", dberr.OwnTimeout(ctx, err))
	}
	out := make([]Ban, len(rows))
	for i, r := range rows {
		out[i] = Ban{Key: r.Key, Until: r.Until, Since: r.BannedAt}
	}
	return out, nil
}

// heard takes a notification of topic ban: "<until µs> <key>" (banned) or
// "- <key>" (lifted).
func (b *Bans) heard(msg string) {
	head, stored, ok := strings.Cut(msg, " ")
	if !ok {
		return
	}
	if head == "-" {
		b.forget(stored)
		return
	}
	us, err := strconv.ParseInt(head, 10, 64)
	if err != nil {
		return
	}
	b.put(stored, b.local(time.UnixMicro(us)))
}

// remember keeps stored's ban unless a notification of the topic (or a new
// bus epoch) arrived since seq was read.
func (b *Bans) remember(stored string, until time.Time, seq uint64) {
	if b.sub.Seq() != seq {
		return
	}
	b.put(stored, until)
}

func (b *Bans) put(stored string, until time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if _, ok := b.mem[stored]; !ok && len(b.mem) >= maxMemory {
		now := time.Now()
		for k, u := range b.mem {
			if !now.Before(u) {
				delete(b.mem, k)
			}
		}
		if len(b.mem) >= maxMemory {
			return
		}
	}
	b.mem[stored] = until
	b.changes++
}

func (b *Bans) forget(stored string) {
	b.mu.Lock()
	delete(b.mem, stored)
	b.changes++
	b.mu.Unlock()
}

// setOffset takes the database clock at from a statement sent and
// answered at sent and received on this replica's clock: the database
// read its clock between the two, taken as their midpoint, so the
// estimate is off by at most half the round trip. It keeps the estimate
// of the quickest round trip of the last 30 s (a loaded moment's slow
// one does not move it).
func (b *Bans) setOffset(at, sent, received time.Time) {
	rtt := received.Sub(sent)
	b.clockMu.Lock()
	defer b.clockMu.Unlock()
	if b.clockAt.IsZero() || rtt <= b.clockRTT || received.Sub(b.clockAt) > 30*time.Second {
		b.clockAt, b.clockRTT = received, rtt
		b.offset.Store(int64(at.Sub(sent.Add(rtt / 2))))
	}
}

// local is the database time t on this replica's clock (monotonic, so
// that a ban ends exactly when this replica's clock says).
func (b *Bans) local(t time.Time) time.Time {
	now := time.Now()
	return now.Add(t.Add(-time.Duration(b.offset.Load())).Sub(now.Round(0)))
}

// refresh reads the live bans again, in the background, when the bus has
// connected since the last read (it may have missed notifications), or,
// while the bus is down, when the last read is a second old.
func (b *Bans) refresh() {
	now := time.Now().UnixNano()
	if now-b.failedAt.Load() < int64(refreshEvery) {
		return
	}
	epoch := b.bus.Epoch()
	if b.bus.Live() {
		if b.loaded.Load() == epoch+1 {
			return
		}
	} else if now-b.lastRead.Load() < int64(refreshEvery) {
		return
	}
	if !b.loading.CompareAndSwap(false, true) {
		return
	}
	b.lastRead.Store(now)
	go func() {
		defer b.loading.Store(false)
		if err := b.reload(); err != nil {
			b.failedAt.Store(time.Now().UnixNano())
		}
	}()
}

// reload replaces the memory with the live bans, read again until no
// notification arrived while the statement ran.
func (b *Bans) reload() error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for range 3 {
		seq := b.sub.Seq()
		b.mu.RLock()
		changes := b.changes
		b.mu.RUnlock()
		epoch, live := b.bus.Epoch(), b.bus.Live()
		sent := time.Now()
		rows, err := b.q.BanList(ctx, b.pool, maxMemory)
		if err != nil {
			return err
		}
		received := time.Now()
		if len(rows) > 0 {
			b.setOffset(rows[0].Now, sent, received)
		}
		if b.sub.Seq() != seq {
			continue
		}
		mem := make(map[string]time.Time, len(rows))
		for _, r := range rows {
			mem[r.Key] = b.local(r.Until)
		}
		b.mu.Lock()
		// A notification, or a ban made or lifted here (Lift), while the
		// statement ran: what it read may be older; read again.
		if b.sub.Seq() != seq || b.changes != changes {
			b.mu.Unlock()
			continue
		}
		b.mem = mem
		b.mu.Unlock()
		if live {
			b.loaded.Store(epoch + 1)
		}
		return nil
	}
	return errors.New("ban: the bans kept changing while they were read")
}
