package slots

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/permit"
	share "github.com/pglimit/pglimit/internal/shares"
)

// Shares (Config.Shares): the cold path of a slot limiter of one scope
// per claim (the in-flight cap). Of every scope's Cap, Shares slots are
// kept apart, one per share, and the database decides the rest: a claim
// in the database may take Cap − the shares still reserved for its scope.
// A replica holding one of the shares' leases (package internal/shares,
// pglimit.share) runs one request of every scope on its share's slot, in
// memory, with no statement: a token that has at most one request in
// flight on a replica (one every few seconds, spread by a balancer) costs
// nothing to claim or release.
//
// A share's slot of a scope is given up for the holder's life (revoked)
// when a claim in the database finds the scope full while shares still
// hold it: the claimer asks every replica on the bus ("revoke"), each
// holder stops running the scope's requests on its share — at once, or
// when the one running ends — and says so ("revoked", with its holder's
// id), and the claimer tries again with the Cap less the shares still
// reserved. So a token that needs more than what the database decides at
// first (90 % of its cap, on one replica) waits a bus round trip, and is
// not refused.
//
// Exact: a claim counts every share reserved that has not said it gave
// the scope up, among the holders the database lists — a holder whose
// lease ran out counted for MaxDuration + grace more, as its last
// requests may run that long; a list older than cacheAge counts every
// share. A new holder runs nothing on its share for the slots' lease and
// cacheAge after its claim, by when every slot claimed without counting it
// has lapsed. What a holder gave up it never takes back, so what claims
// counted as given up stays so; and slot numbers are unique in a scope,
// so the slots in the database never outnumber the largest Cap a claim
// was judged by.
const (
	// cacheAge is how old a claimer's list of holders may be before it
	// counts every share as reserved.
	cacheAge = 5 * time.Second
	// revokeWait bounds how long a claimer waits for the holders to give
	// a scope up.
	revokeWait = time.Second
	// maxRevoked bounds the scopes a holder remembers it gave up; past it
	// it gives up every scope (runs nothing on its share).
	maxRevoked = 100_000
)

// slotShares is a Limiter's side of Config.Shares.
type slotShares struct {
	l      *Limiter
	pool   *pgxpool.Pool
	q      *db.Queries
	name   string
	slots  int
	linger time.Duration
	lease  *share.Lease
	topic  string
	sub    *bus.Subscription

	mu sync.Mutex
	// As a holder: the scopes running a request on the share (and whether
	// a claimer asked it to give the scope up meanwhile), the scopes given
	// up, and all: every scope given up.
	running map[string]bool
	revoked map[string]bool
	all     bool
	// As a claimer: the holders the database lists (refreshed at most
	// cacheAge ago: listed), and which of them gave up which scope.
	holders    []uuid.UUID
	listed     time.Time
	refreshing bool
	gave       map[string]map[uuid.UUID]bool
	waiters    map[string][]chan struct{}
}

func newSlotShares(l *Limiter, pool *pgxpool.Pool, kind permit.Kind, slots int, linger, timeout time.Duration) *slotShares {
	name := "slots:" + string(kind) + ":" + l.Name
	b := bus.For(pool)
	s := &slotShares{l: l, pool: pool, q: db.New(), name: name, slots: slots, linger: linger,
		// A holder holds a share only while its bus listens: it must hear
		// the claimers that ask it to give a scope up.
		lease: share.New(pool, share.Config{Name: name, Slots: slots, Timeout: timeout, Wait: linger + cacheAge, Live: b.Live,
			Lingers: true}),
		topic: "shares/" + name, running: map[string]bool{}, revoked: map[string]bool{},
		gave: map[string]map[uuid.UUID]bool{}, waiters: map[string][]chan struct{}{}}
	s.sub = b.Subscribe(s.topic, s.heard, nil)
	return s
}

// take runs a request of scope on this replica's share, with no
// statement, or reports false.
func (s *slotShares) take(scope string, now time.Time) (Held, bool) {
	if _, ok := s.lease.Spendable(now); !ok {
		return Held{}, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.all || s.revoked[scope] {
		return Held{}, false
	}
	if _, busy := s.running[scope]; busy {
		return Held{}, false
	}
	s.running[scope] = false
	return Held{local: &localSlot{s: s, scope: scope}}, true
}

// localSlot is a request running on a share.
type localSlot struct {
	s     *slotShares
	scope string
	once  sync.Once
}

// release ends the request; if a claimer asked meanwhile, the scope is
// given up now and the holders told.
func (ls *localSlot) release() {
	ls.once.Do(func() {
		s := ls.s
		s.mu.Lock()
		asked := s.running[ls.scope]
		delete(s.running, ls.scope)
		s.mu.Unlock()
		if asked {
			s.announce(ls.scope)
		}
	})
}

// reserved is how many shares a claim of scope must leave apart: the
// holders listed that have not given it up, every share when the list is
// old. It refreshes the list in the background when half of cacheAge is
// gone.
func (s *slotShares) reserved(scope string, now time.Time) int {
	s.mu.Lock()
	if s.listed.IsZero() && !s.refreshing {
		// The first claim reads the list itself, rather than count every
		// share reserved until the background read lands.
		s.refreshing = true
		s.mu.Unlock()
		s.refresh()
		s.mu.Lock()
	}
	defer s.mu.Unlock()
	age := now.Sub(s.listed)
	if age > cacheAge/2 && !s.refreshing {
		s.refreshing = true
		go s.refresh()
	}
	if age > cacheAge {
		return s.slots
	}
	n := 0
	for _, h := range s.holders {
		if !s.gave[scope][h] {
			n++
		}
	}
	return n
}

// refresh reads the holders from the database: those whose lease runs,
// or ran out less than linger ago.
func (s *slotShares) refresh() {
	ctx, cancel := dberr.WithTimeout(context.Background(), cacheAge/2)
	defer cancel()
	sent := time.Now()
	rows, err := s.q.ShareHolders(ctx, s.pool, &db.ShareHoldersParams{Name: s.name, LingerMs: s.linger.Milliseconds()})
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refreshing = false
	if err != nil {
		return
	}
	s.holders = s.holders[:0]
	live := map[uuid.UUID]bool{}
	for _, h := range rows {
		s.holders = append(s.holders, h)
		live[h] = true
	}
	// What holders no longer listed gave up is forgotten: they count for
	// nothing now.
	for scope, hs := range s.gave {
		for h := range hs {
			if !live[h] {
				delete(hs, h)
			}
		}
		if len(hs) == 0 {
			delete(s.gave, scope)
		}
	}
	// The list is as of the statement's send (from below).
	s.listed = sent
}

// revoke asks the holders to give scope up and waits until every listed
// holder did, revokeWait passed, or ctx ended.
func (s *slotShares) revoke(ctx context.Context, scope string) {
	ch := make(chan struct{}, 1)
	s.mu.Lock()
	s.waiters[scope] = append(s.waiters[scope], ch)
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		ws := s.waiters[scope]
		for i, w := range ws {
			if w == ch {
				s.waiters[scope] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(s.waiters[scope]) == 0 {
			delete(s.waiters, scope)
		}
		s.mu.Unlock()
	}()
	// Our own share first: it is in this process.
	s.giveUp(scope)
	nctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), s.l.leaserTimeout())
	err := s.q.BusNotify(nctx, s.pool, s.topic+"\nrevoke - "+scope)
	cancel()
	if err != nil {
		return
	}
	timer := time.NewTimer(revokeWait)
	defer timer.Stop()
	for s.reserved(scope, time.Now()) > s.ownBusy(scope) {
		select {
		case <-ch:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// ownBusy is 1 while a request of scope runs on this replica's share (it
// gives the scope up when it ends), 0 otherwise.
func (s *slotShares) ownBusy(scope string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, busy := s.running[scope]; busy {
		return 1
	}
	return 0
}

// heard handles a message of the shares' topic: "revoke - <scope>" (a
// claimer asks every holder to give scope up) or "revoked <holder>
// <scope>" (a holder did).
func (s *slotShares) heard(msg string) {
	what, rest, ok := strings.Cut(msg, " ")
	if !ok {
		return
	}
	who, scope, ok := strings.Cut(rest, " ")
	if !ok {
		return
	}
	switch what {
	case "revoke":
		s.giveUp(scope)
	case "revoked":
		h, err := uuid.Parse(who)
		if err != nil {
			return
		}
		s.mu.Lock()
		if s.gave[scope] == nil {
			s.gave[scope] = map[uuid.UUID]bool{}
		}
		s.gave[scope][h] = true
		for _, w := range s.waiters[scope] {
			select {
			case w <- struct{}{}:
			default:
			}
		}
		s.mu.Unlock()
	}
}

// giveUp gives scope up for this holder's life: no request of it runs on
// the share again; the holders are told now, or when the request running
// on the share ends.
func (s *slotShares) giveUp(scope string) {
	s.mu.Lock()
	if !s.all {
		if len(s.revoked) >= maxRevoked {
			s.all = true
		} else {
			s.revoked[scope] = true
		}
	}
	if _, busy := s.running[scope]; busy {
		s.running[scope] = true // told when it ends
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.announce(scope)
}

// announce tells the holders that this one gave scope up, in the
// background (its own claims hear it too).
func (s *slotShares) announce(scope string) {
	go func() {
		ctx, cancel := dberr.WithTimeout(context.Background(), s.l.leaserTimeout())
		defer cancel()
		_ = s.q.BusNotify(ctx, s.pool, s.topic+"\nrevoked "+s.lease.Holder().String()+" "+scope)
	}()
}

// flush stops running requests on the share and gives it back.
func (s *slotShares) flush(ctx context.Context) error { return s.lease.Flush(ctx) }

// ShareLease is the limiter's lease on a share (nil without Shares): for
// the tests of the packages over this one.
func (l *Limiter) ShareLease() *share.Lease {
	if l.shares == nil {
		return nil
	}
	return l.shares.lease
}
