// Package shares holds a replica's lease on one of a limiter's shares (the
// rows of pglimit.share): the right to decide part of a limit in memory,
// with no statement, that at most Slots replicas have at once. A limiter
// asks Spendable before it spends its share; the Lease claims a share when
// it holds none, renews it a third of a lease apart while it is asked, and
// gives it back once nobody asked for two leases, or at Flush.
//
// What a holder may spend is the limiter's business (ratelimit: a part of
// each key's rate; middleware/inflight: a slot of each token); this
// package guarantees when: a holder spends only from From — Wait after the
// statement that gave it the share, and never before a lease after it —
// until its lease runs out by its own clock, measured from before the
// statement that gave or renewed it. A lease is at least twice the
// Timeout, so a claim answered at all was decided within half a lease of
// its send: a new holder's first spend comes after the lease it took over
// ran out, whether its holder was killed, cut off, or lost its row to a
// restart of the database (an UNLOGGED table).
package shares

import (
	"context"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/dberr"
)

// DefaultLease is how long a lease runs when Config.Lease is 0.
const DefaultLease = 10 * time.Second

// Config is a Lease's configuration; the limiter checks it.
type Config struct {
	// Name is the shares' name in pglimit.share (the limiter's kind and
	// name): limiters of one name share its Slots.
	Name string
	// Slots is how many shares there are.
	Slots int
	// Lease is how long a claim or renewal holds a share (raised to twice
	// Timeout); Wait how long after its claim a new holder spends nothing
	// (at least Lease).
	Lease, Wait time.Duration
	// Timeout bounds each statement.
	Timeout time.Duration
	// Live, when set, tells whether the holder may hold a share now (its
	// invalidation bus listens): while it does not, the keeper claims
	// none and stops renewing the one it holds, and Spendable is false.
	Live func() bool
	// Lingers: what the holder spent may outlive a decision (a request
	// running on a share), so a share it stops holding — idle, or its bus
	// silent — is left to run out in the database (and be counted as long
	// as the limiter counts a lapsed share) rather than given back; Flush
	// still gives it back.
	Lingers bool
}

// Lease is one limiter's hold on a share. It is safe for concurrent use.
type Lease struct {
	pool   *pgxpool.Pool
	q      *db.Queries
	c      Config
	holder uuid.UUID

	mu sync.Mutex
	// slot is the share held (0: none); from is when it may be spent,
	// until when it must no longer be; running: the keeper runs; used:
	// when Spendable was last asked; stopped: Flush (or Kill) ran.
	slot        int32
	from, until time.Time
	running     bool
	used        time.Time
	stopped     bool
}

// New returns a Lease of c on pool; it claims nothing until asked.
func New(pool *pgxpool.Pool, c Config) *Lease {
	if c.Lease == 0 {
		c.Lease = DefaultLease
	}
	c.Lease = max(c.Lease, 2*c.Timeout)
	c.Wait = max(c.Wait, c.Lease)
	return &Lease{pool: pool, q: db.New(), c: c, holder: uuid.New()}
}

// Holder is this Lease's id: what its holder's other messages name.
func (l *Lease) Holder() uuid.UUID { return l.holder }

// SetLease sets how long the lease runs and how long a new holder waits
// (tests only).
func (l *Lease) SetLease(lease, wait time.Duration) {
	l.mu.Lock()
	l.c.Lease, l.c.Wait = lease, max(wait, lease)
	l.mu.Unlock()
}

// Spendable reports whether the share may be spent at now, and from when
// it has been spendable (a limiter starts what it spends of it empty at
// that time). It starts the keeper when it does not run.
func (l *Lease) Spendable(now time.Time) (from time.Time, ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.stopped {
		return time.Time{}, false
	}
	l.used = now
	if !l.running {
		l.running = true
		go l.keep()
	}
	if l.slot != 0 && !now.Before(l.until) {
		l.slot = 0 // the lease ran out: the share may be another's now
	}
	if l.slot == 0 || now.Before(l.from) || l.c.Live != nil && !l.c.Live() {
		return time.Time{}, false
	}
	return l.from, true
}

// keep claims a share and renews its lease a third of a lease apart while
// Spendable is asked; once it has not been for two leases (the limiter
// idle, or stopped), it gives the share back and ends.
func (l *Lease) keep() {
	for {
		l.mu.Lock()
		lease := l.c.Lease
		if l.stopped || time.Since(l.used) > 2*lease {
			slot := l.slot
			l.slot, l.running = 0, false
			if slot != 0 && !l.stopped && !l.c.Lingers {
				go l.release(slot)
			}
			l.mu.Unlock()
			return
		}
		slot := l.slot
		live := l.c.Live == nil || l.c.Live()
		if !live && slot != 0 {
			l.slot = 0
			if !l.c.Lingers {
				go l.release(slot)
			}
		}
		l.mu.Unlock()
		switch {
		case !live:
		case slot == 0:
			l.claim()
		default:
			l.renew(slot)
		}
		time.Sleep(lease / 3)
	}
}

// claim takes a share; it is spendable from Wait after the claim was
// sent.
func (l *Lease) claim() {
	ctx, cancel := dberr.WithTimeout(context.Background(), l.c.Timeout)
	defer cancel()
	l.mu.Lock()
	lease, wait := l.c.Lease, l.c.Wait
	l.mu.Unlock()
	sent := time.Now()
	slot, err := l.q.ShareClaim(ctx, l.pool, &db.ShareClaimParams{Name: l.c.Name, Holder: l.holder,
		LeaseMs: lease.Milliseconds(), Slots: int32(l.c.Slots)})
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		return // none free, or no answer: the keeper tries again
	}
	if l.stopped {
		go l.release(slot)
		return
	}
	l.slot, l.from, l.until = slot, sent.Add(wait), sent.Add(lease)
}

// renew extends slot's lease from the statement's send.
func (l *Lease) renew(slot int32) {
	ctx, cancel := dberr.WithTimeout(context.Background(), l.c.Timeout)
	defer cancel()
	l.mu.Lock()
	lease := l.c.Lease
	l.mu.Unlock()
	sent := time.Now()
	n, err := l.q.ShareRenew(ctx, l.pool, &db.ShareRenewParams{Name: l.c.Name, Slot: slot, Holder: l.holder,
		LeaseMs: lease.Milliseconds()})
	l.mu.Lock()
	defer l.mu.Unlock()
	switch {
	case l.slot != slot:
	case err == nil && n == 1:
		l.until = sent.Add(lease)
	case err == nil:
		l.slot = 0 // lapsed, or taken: claim again, and wait
	}
	// A renewal that failed leaves the lease to run out at until.
}

func (l *Lease) release(slot int32) {
	ctx, cancel := dberr.WithTimeout(context.Background(), l.c.Timeout)
	defer cancel()
	_ = l.q.ShareRelease(ctx, l.pool, &db.ShareReleaseParams{Name: l.c.Name, Slot: slot, Holder: l.holder})
}

// Flush stops spending and gives the share back; the keeper ends at its
// next turn.
func (l *Lease) Flush(ctx context.Context) error {
	l.mu.Lock()
	slot := l.slot
	l.slot, l.stopped = 0, true
	l.mu.Unlock()
	if slot == 0 {
		return nil
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.c.Timeout)
	defer cancel()
	return l.q.ShareRelease(ctx, l.pool, &db.ShareReleaseParams{Name: l.c.Name, Slot: slot, Holder: l.holder})
}

// Kill stops spending as a killed replica stops: the share is never given
// back and its lease runs out in the database (tests only).
func (l *Lease) Kill() {
	l.mu.Lock()
	l.stopped, l.slot = true, 0
	l.mu.Unlock()
}
