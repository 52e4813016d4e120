// Sending: one statement for a batch of claims and releases, on one shard or
// each alone when they race, and what the database answered, judged.

package permit

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/keys"
)

// send runs one round trip — the releases, then the claims, in one pgx
// Batch (one implicit transaction), after the scope locks when a claim is
// judged again or the claims do not fit a lock-free form — and hands
// every op its outcome. Releases go before claims, so a claim never finds
// held a slot that a release of the same batch gives back; a claim refused
// while a release of its scopes was in flight in another batch of this
// Leaser is judged again after it (a caller that released and then claimed
// never sees its own release pending), and so is a claim that lost the
// slot it picked to a claim that did not take the scope lock.
//
// A round trip of one op is a single statement: a release alone whose
// slots are known (SlotReleaseOne, SlotReleaseTwo), or a first claim alone
// (SlotClaimLone, SlotClaimTwo, without the scope lock); first claims each
// alone in a scope of their own go without the lock too (SlotClaimEach).
// caller is the ctx of an inline release's caller (nil otherwise): the
// round trip ends with it too, and a release it cut is queued again (the
// release is idempotent).
func (l *Leaser) send(ops []*op, caller context.Context) {
	ctx := l.bound.get()
	if caller != nil && caller.Done() != nil {
		var cancel func()
		ctx, cancel = either(caller, ctx)
		defer cancel()
	}
	start := time.Now()

	var (
		rel    = db.SlotReleaseParams{Kind: string(l.kind)}
		claims []*op
		scopes []string
	)
	for _, o := range ops {
		if o.claim == nil {
			rel.Scopes = append(rel.Scopes, o.release...)
			rel.LeaseIds = append(rel.LeaseIds, o.id.String())
			continue
		}
		claims = append(claims, o)
		for _, s := range o.claim.Scopes {
			scopes = append(scopes, s.Key)
		}
	}

	var (
		rows []*db.SlotClaimRow
		err  error
		b    = &batch{conn: l.pool}
	)
	onShard, cerr := l.citus.On(ctx, l.pool)
	// The statements travel in one batch: see sql/queries/slot.sql.
	switch {
	case cerr != nil:
		err = cerr
	case onShard:
		rows, err = l.onShard(ctx, ops, claims)
		if err == nil && len(claims) > 0 {
			err = l.judge(claims, rows)
		}
	case len(claims) == 0 && len(ops) == 1 && len(ops[0].slotNos) == 1 && len(ops[0].release) == 1:
		// One release of one slot: its row by its primary key.
		o := ops[0]
		err = l.q.SlotReleaseOne(ctx, l.pool, &db.SlotReleaseOneParams{Kind: string(l.kind),
			Scope: o.release[0], Slot: int32(o.slotNos[0]), LeaseID: rel.LeaseIds[0]})
	case len(claims) == 0 && len(ops) == 1 && len(ops[0].slotNos) == 2 && len(ops[0].release) == 2:
		// One release of two slots: their rows by their primary keys.
		o := ops[0]
		err = l.q.SlotReleaseTwo(ctx, l.pool, &db.SlotReleaseTwoParams{Kind: string(l.kind),
			Scope1: o.release[0], Slot1: int32(o.slotNos[0]), Scope2: o.release[1], Slot2: int32(o.slotNos[1]),
			LeaseID: rel.LeaseIds[0]})
	case len(claims) == 0:
		// Releases alone: one statement, no planner settings (they cost a
		// statement of their own and the release plans cheaply).
		_, _ = l.q.SlotRelease(ctx, b, &rel)
		err = b.send(ctx)
	case len(ops) == 1 && !claims[0].locked:
		// A first claim alone: one statement, no lock.
		rows, err = l.claimAlone(ctx, l.pool, claims[0])
		if err == nil {
			err = l.judge(claims, rows)
		}
	case eachAlone(claims):
		// First claims, each alone in a scope of its own: the releases and
		// one claim statement, no lock.
		if len(rel.LeaseIds) > 0 {
			_, _ = l.q.SlotRelease(ctx, b, &rel)
			rows, err = l.claimEach(ctx, b, claims)
			if err == nil {
				err = b.closeErr
			}
		} else {
			rows, err = l.claimEach(ctx, l.pool, claims)
		}
		if err == nil {
			err = l.judge(claims, rows)
		}
	default:
		_ = l.q.SlotLockScopes(ctx, b, &db.SlotLockScopesParams{Kind: string(l.kind), Scopes: scopes,
			LockTimeoutMs: l.lockTimeoutMs()})
		if len(rel.LeaseIds) > 0 {
			_, _ = l.q.SlotRelease(ctx, b, &rel)
		}
		rows, err = l.claim(ctx, b, claims)
		if err == nil {
			err = b.closeErr
		}
		if err == nil {
			err = l.judge(claims, rows)
		}
	}
	// The round trip's bound is the Leaser's Timeout, never a caller's
	// context: when it ends the batch, the database did not answer in time
	// (pglimit.Classify: unavailable). An inline release whose caller
	// stopped waiting goes again without it, and so does a batch that lost
	// a race as a whole (SlotClaimTwo, SlotClaim: nothing of it was kept).
	cut := caller != nil && err != nil && caller.Err() != nil
	again := err != nil && lostRace(err)
	err = dberr.LockTimeout(dberr.OwnTimeout(ctx, err))
	if err != nil && len(rel.LeaseIds) > 0 && !cut && !again {
		l.log.Warn("permit: release failed; the slots lapse on their own at the end of their lease",
			"kind", string(l.kind), "leases", len(rel.LeaseIds), "err", err)
	}

	l.mu.Lock()
	var done []*op
	for _, o := range ops {
		for _, k := range o.release {
			if l.releasing[k]--; l.releasing[k] == 0 {
				delete(l.releasing, k)
			}
		}
		if (cut || again) && o.claim == nil && o.state.CompareAndSwap(sent, queued) {
			l.queue = append([]*op{o}, l.queue...)
			continue
		}
		opErr := err
		if again {
			// Nothing was taken: judged again, or given up by its caller.
			opErr, o.lost = nil, true
		}
		if o.lost && o.claim != nil {
			l.contend(o.claim)
		}
		if opErr == nil && (o.lost || o.refused != nil && o.raced && !o.retry) && o.state.CompareAndSwap(sent, queued) {
			if o.tries++; o.tries <= maxRetries {
				// Judge it again once the release it raced has landed, or
				// under the scope lock, under a lease id of its own
				// (nothing of the first try can touch it).
				o.refused, o.slots, o.raced, o.lost, o.retry, o.id = nil, nil, false, false, true, uuid.New()
				l.queue = append([]*op{o}, l.queue...)
				continue
			}
			o.state.Store(sent)
			o.refused, o.lost, opErr = nil, false, errRaces
		}
		if opErr != nil {
			o.err = opErr
		}
		if !o.state.CompareAndSwap(sent, finished) && o.claim != nil && o.err == nil && o.refused == nil && !o.lost {
			// Its caller stopped waiting: give the slots back.
			l.push(giveBack(o))
		}
		done = append(done, o)
		delete(l.pending, o)
	}
	// A claim left queued while a release of its scopes was in flight may
	// have seen every other flusher end meanwhile: make sure one will send
	// it (this one, or another).
	l.kick()
	l.mu.Unlock()
	if l.onRel != nil && !cut && !again {
		took := time.Since(start)
		for range rel.LeaseIds {
			l.onRel(took, err)
		}
	}
	for _, o := range done {
		close(o.done)
	}
}

// lockTimeoutMs is the lock_timeout of a round trip under the scope lock
// (SlotLockScopes): half the Leaser's Timeout, so that a claim that cannot
// have its turn fails as unavailable with the rest of the Timeout to spare
// and its connection usable, instead of being cut at the Timeout.
func (l *Leaser) lockTimeoutMs() int32 {
	return int32(min(max(l.timeout/2/time.Millisecond, 1), math.MaxInt32))
}

// onShard sends ops on a Citus cluster, where each statement must be one
// shard's: each release by its slots' primary keys (SlotReleaseOne; a
// release without its slot numbers, SlotRelease for each scope), then each
// claim with SlotClaimOnShard, which judges it on its scope's shard to the
// end (it never loses a race). A claim in two scopes is a transaction of
// its own (on Citus, a distributed one: both shards commit or neither)
// that claims them in scope order and commits only when both were
// granted. The rows are SlotClaim's, one per claim and scope.
func (l *Leaser) onShard(ctx context.Context, ops, claims []*op) ([]*db.SlotClaimRow, error) {
	for _, o := range ops {
		if o.claim != nil {
			continue
		}
		for i, scope := range o.release {
			var err error
			if len(o.slotNos) == len(o.release) {
				err = l.q.SlotReleaseOne(ctx, l.pool, &db.SlotReleaseOneParams{Kind: string(l.kind),
					Scope: scope, Slot: int32(o.slotNos[i]), LeaseID: o.id.String()})
			} else {
				_, err = l.q.SlotRelease(ctx, l.pool, &db.SlotReleaseParams{Kind: string(l.kind),
					Scopes: []string{scope}, LeaseIds: []string{o.id.String()}})
			}
			if err != nil {
				return nil, err
			}
		}
	}
	var rows []*db.SlotClaimRow
	for n, o := range claims {
		c := o.claim
		mine := make([]*db.SlotClaimRow, len(c.Scopes))
		claimIn := func(conn db.DBTX, k int) error {
			s := c.Scopes[k]
			r, err := l.q.SlotClaimOnShard(ctx, conn, &db.SlotClaimOnShardParams{Scope: s.Key, Kind: string(l.kind),
				Cap: int32(s.Cap), LeaseID: o.id.String(), Holder: c.Holder, Endpoint: c.Endpoint,
				Replica: l.replica, LeaseMs: c.Lease.Milliseconds()})
			if err != nil {
				return err
			}
			mine[k] = &db.SlotClaimRow{Claim: int32(n + 1), Pos: int32(k + 1), GrantedSlot: r.GrantedSlot,
				Live: r.Live, Cap: int32(s.Cap), FirstLapseMs: r.FirstLapseMs}
			return nil
		}
		if len(c.Scopes) == 1 {
			if err := claimIn(l.pool, 0); err != nil {
				return nil, err
			}
		} else if err := l.claimBoth(ctx, c, mine, claimIn); err != nil {
			return nil, err
		}
		for k, r := range mine {
			if r == nil { // not tried: a scope before it refused
				mine[k] = &db.SlotClaimRow{Claim: int32(n + 1), Pos: int32(k + 1), Cap: int32(c.Scopes[k].Cap)}
			}
		}
		rows = append(rows, mine...)
	}
	return rows, nil
}

// claimBoth claims c's two scopes in one transaction, in scope order
// (two claims of the same scopes wait for each other's rows in one order,
// never in a cycle), and commits only when both were granted; otherwise it
// rolls back and marks none granted.
func (l *Leaser) claimBoth(ctx context.Context, c *Claim, mine []*db.SlotClaimRow,
	claimIn func(db.DBTX, int) error) error {
	tx, err := l.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	order := []int{0, 1}
	if c.Scopes[1].Key < c.Scopes[0].Key {
		order = []int{1, 0}
	}
	for _, k := range order {
		if err := claimIn(tx, k); err != nil {
			return err
		}
		if mine[k].GrantedSlot == 0 {
			for _, r := range mine {
				if r != nil {
					r.GrantedSlot = 0
				}
			}
			return tx.Rollback(ctx)
		}
	}
	return tx.Commit(ctx)
}

// coarse hands out a context that ends between d and d + d/32 from now:
// the bound of a round trip (Options.Timeout), shared by every round trip
// that starts while it has at least d left, so that a round trip costs no
// timer of its own. (A new timer sooner than the runtime's next one wakes
// its network poller on another thread; two timers per claim + release
// cost about a tenth of a one-row upsert at 1 client on 2 CPUs.) A shared
// context ends on its own at its deadline; the next round trip after that
// takes a new one.
type coarse struct {
	d      time.Duration
	own    bool // the Leaser's own Timeout (dberr.WithTimeout), or a plain deadline
	mu     sync.Mutex
	ctx    context.Context
	cancel context.CancelFunc // kept only so that it is not lost: ctx ends at its deadline
	end    time.Time
}

func (c *coarse) get() context.Context {
	now := time.Now()
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ctx == nil || c.end.Sub(now) < c.d {
		slack := c.d / 32
		if c.own {
			c.ctx, c.cancel = dberr.WithTimeout(context.Background(), c.d+slack)
		} else {
			c.ctx, c.cancel = context.WithTimeout(context.Background(), c.d+slack)
		}
		c.end = now.Add(c.d + slack)
	}
	return c.ctx
}

// either returns a context that ends when a or b ends, with the cause of
// the first to end (so dberr.OwnTimeout still tells a Leaser's Timeout
// from the caller's ctx), and no timer of its own.
func either(a, b context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(a)
	stop := context.AfterFunc(b, func() { cancel(context.Cause(b)) })
	return ctx, func() {
		stop()
		cancel(context.Canceled)
	}
}

// maxRetries bounds how many times one claim is judged again after losing
// its slot to other claims (each loss is another claim's grant, so a
// claim loses again and again only while others keep taking the scope's
// room as fast as it frees).
const maxRetries = 100

// errRaces is a claim that lost maxRetries races for a free slot.
var errRaces = errors.New("the claim lost every race for a free slot")

// eachAlone reports whether claims can go without the scope lock in one
// SlotClaimEach: none takes the lock (a claim judged again, or of a scope
// that lost a race lately), each is in one scope, and no two share a
// scope.
func eachAlone(claims []*op) bool {
	if len(claims) == 0 {
		return false
	}
	for i, o := range claims {
		if o.locked || len(o.claim.Scopes) != 1 {
			return false
		}
		for _, p := range claims[:i] {
			if p.claim.Scopes[0].Key == o.claim.Scopes[0].Key {
				return false
			}
		}
	}
	return true
}

// claimEach runs SlotClaimEach for claims (see eachAlone) on conn.
func (l *Leaser) claimEach(ctx context.Context, conn db.DBTX, claims []*op) ([]*db.SlotClaimRow, error) {
	p := &db.SlotClaimEachParams{Kind: string(l.kind), Replica: l.replica}
	for _, o := range claims {
		c := o.claim
		p.Scopes = append(p.Scopes, c.Scopes[0].Key)
		p.Caps = append(p.Caps, int32(c.Scopes[0].Cap))
		p.LeaseIds = append(p.LeaseIds, o.id.String())
		p.Holders = append(p.Holders, c.Holder)
		p.Endpoints = append(p.Endpoints, c.Endpoint)
		p.LeaseMs = append(p.LeaseMs, c.Lease.Milliseconds())
	}
	each, err := l.q.SlotClaimEach(ctx, conn, p)
	if err != nil {
		return nil, err
	}
	rows := make([]*db.SlotClaimRow, len(each))
	for i, r := range each {
		rows[i] = &db.SlotClaimRow{Claim: r.Claim, Pos: 1, GrantedSlot: r.GrantedSlot, Live: r.Live, Cap: r.Cap,
			FirstLapseMs: r.FirstLapseMs}
	}
	return rows, nil
}

// claimAlone runs the claim statement of the lone claim o on conn (the
// pool: its own transaction, without the scope lock; or a batch, after
// it): SlotClaimLone for one scope, SlotClaimTwo for two.
func (l *Leaser) claimAlone(ctx context.Context, conn db.DBTX, o *op) ([]*db.SlotClaimRow, error) {
	c := o.claim
	if len(c.Scopes) == 1 {
		s := c.Scopes[0]
		r, err := l.q.SlotClaimLone(ctx, conn, &db.SlotClaimLoneParams{Kind: string(l.kind), Scope: s.Key,
			LeaseID: o.id.String(), Holder: c.Holder, Endpoint: c.Endpoint, Replica: l.replica,
			LeaseMs: c.Lease.Milliseconds(), Cap: int32(s.Cap)})
		if err != nil {
			return nil, err
		}
		return []*db.SlotClaimRow{{Claim: 1, Pos: 1, GrantedSlot: r.GrantedSlot, Live: r.Live, Cap: int32(s.Cap),
			FirstLapseMs: r.FirstLapseMs}}, nil
	}
	two, err := l.q.SlotClaimTwo(ctx, conn, &db.SlotClaimTwoParams{Kind: string(l.kind),
		Scope1: c.Scopes[0].Key, Cap1: int32(c.Scopes[0].Cap), Scope2: c.Scopes[1].Key, Cap2: int32(c.Scopes[1].Cap),
		LeaseID: o.id.String(), Holder: c.Holder, Endpoint: c.Endpoint, Replica: l.replica,
		LeaseMs: c.Lease.Milliseconds()})
	if err != nil {
		return nil, err
	}
	rows := make([]*db.SlotClaimRow, len(two))
	for i, r := range two {
		rows[i] = &db.SlotClaimRow{Claim: 1, Pos: r.Pos, GrantedSlot: r.GrantedSlot, Live: r.Live, Cap: r.Cap,
			FirstLapseMs: r.FirstLapseMs}
	}
	return rows, nil
}

// lostRace reports whether err is a claim statement's refusal to replace a
// live holder (SlotClaimTwo, SlotClaim: a NOT NULL violation on
// pglimit.slot's slot number): another claim took a slot it picked first,
// and the statement, with its transaction, took nothing. A deadlock
// (which the claim statements' one order of rows, by scope and slot, keeps
// away) would have taken nothing either, and is judged again too.
func lostRace(err error) bool {
	var pg *pgconn.PgError
	if !errors.As(err, &pg) {
		return false
	}
	return pg.Code == "23502" && pg.SchemaName == "pglimit" && pg.TableName == "slot" && pg.ColumnName == "slot" ||
		pg.Code == "40P01"
}

// claim queues the claim statement of claims on b and sends the batch:
// SlotClaimLone or SlotClaimTwo for a lone claim, SlotClaim for several.
func (l *Leaser) claim(ctx context.Context, b *batch, claims []*op) ([]*db.SlotClaimRow, error) {
	if len(claims) == 1 {
		return l.claimAlone(ctx, b, claims[0])
	}
	p := &db.SlotClaimParams{Kind: string(l.kind), Replica: l.replica}
	for n, o := range claims {
		c := o.claim
		for i, s := range c.Scopes {
			p.Claims = append(p.Claims, int32(n+1))
			p.Positions = append(p.Positions, int32(i+1))
			p.Scopes = append(p.Scopes, s.Key)
			p.Caps = append(p.Caps, int32(s.Cap))
		}
		p.LeaseIds = append(p.LeaseIds, o.id.String())
		p.Holders = append(p.Holders, c.Holder)
		p.Endpoints = append(p.Endpoints, c.Endpoint)
		p.LeaseMs = append(p.LeaseMs, c.Lease.Milliseconds())
	}
	return l.q.SlotClaim(ctx, b, p)
}

// giveBack is the release of every slot of the claim o.
func giveBack(o *op) *op {
	keys := make([]string, len(o.claim.Scopes))
	for i, s := range o.claim.Scopes {
		keys[i] = s.Key
	}
	return &op{release: keys, id: o.id, seq: o.seq, done: make(chan struct{})}
}

// errShape is a claim statement that answered rows the batch did not ask
// for: a bug, never a refusal.
var errShape = errors.New("the claim statement's rows do not match the batch")

// judge reads the claim statement's rows (one per claim and scope, in
// order) into each claim's outcome. A claim granted in some scopes but not
// all cannot happen (a claim statement that would keep half of a claim
// fails whole); it would be given back and judged again rather than kept.
func (l *Leaser) judge(claims []*op, rows []*db.SlotClaimRow) error {
	want := 0
	for _, o := range claims {
		want += len(o.claim.Scopes)
	}
	if len(rows) != want {
		return errShape
	}
	// taken counts, per scope, the slots granted to the batch so far, so a
	// refusal says how many were live when its turn came.
	taken := map[string]int{}
	i := 0
	for n, o := range claims {
		c := o.claim
		mine := rows[i : i+len(c.Scopes)]
		i += len(c.Scopes)
		granted := 0
		for k, r := range mine {
			if int(r.Claim) != n+1 || int(r.Pos) != k+1 {
				return errShape
			}
			if r.GrantedSlot > 0 {
				granted++
			}
		}
		if granted == len(mine) {
			o.slots = make([]int, len(mine))
			for k, r := range mine {
				o.slots[k] = int(r.GrantedSlot)
				taken[c.Scopes[k].Key]++
			}
			continue
		}
		if granted > 0 {
			l.enqueue(giveBack(o))
		}
		// The claims before this one were granted exactly as if judged one
		// after another, so the scope that refused it is, as then, the
		// first that was full in its turn: its live slots and the slots
		// the batch granted before it reach its cap.
		full := -1
		for k, r := range mine {
			if int(r.Live)+taken[c.Scopes[k].Key] >= int(r.Cap) {
				full = k
				break
			}
		}
		if full < 0 {
			// Every scope had room in its turn: the slot it picked was
			// taken first by a claim that did not wait for the scope lock
			// (SlotClaimLone). It is judged again.
			o.lost = true
			continue
		}
		r := mine[full]
		lapse := time.Duration(r.FirstLapseMs) * time.Millisecond
		if r.Live == 0 {
			// Only claims of this batch hold the scope: the first of them
			// lapses a whole lease from now.
			lapse = c.Lease
		}
		o.refused = &RefusedError{Scope: c.Scopes[full], Live: int(r.Live) + taken[c.Scopes[full].Key], FirstLapse: lapse}
	}
	return nil
}

// stored returns c with keys the database can store and texts it can hold.
func stored(c *Claim) *Claim {
	out := *c
	out.Scopes = make([]Scope, len(c.Scopes))
	for i, s := range c.Scopes {
		out.Scopes[i] = Scope{Key: keys.Stored(s.Key), Cap: s.Cap, Kind: s.Kind}
	}
	out.Holder, out.Endpoint = storable(c.Holder), storable(c.Endpoint)
	return &out
}
