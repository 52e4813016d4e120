// Package permit keeps leased slots in PostgreSQL: the one mechanism under
// pglimit's heavy-request permits, its per-token in-flight cap and its
// upload window. A Leaser needs no HTTP: a job runner or a CLI can use it
// as it is.
//
// A Claim asks for one slot in its own scope (a user's cap on an endpoint,
// a token, a user's uploads) and, optionally, one in a scope it shares with
// other claims (the installation's cap over every heavy request), and gets
// both or none. Every slot is a row of pglimit.slot (operators read the
// live ones in the view of the Leaser's Kind) carrying the database-clock
// time at which it lapses on its own, so a replica that dies holds nobody's
// limit for longer than its lease. Release gives every slot of a claim
// back.
//
// # One round trip, shared
//
// A claim is one round trip: one INSERT ... ON CONFLICT DO UPDATE ...
// over the lowest free slot of each of its scopes, taking a lapsed holder's
// row in place (the SQL, with why it is shaped so, is in
// sql/queries/slot.sql). The primary key (kind, scope, slot) makes a
// second holder of a slot impossible (no over-grants). A claim's first
// try takes no lock: two claims of one scope that arrive together may pick
// the same free slot, and the one that loses takes nothing (not half of
// its scopes either) and is judged again under the scope lock, which makes
// claims of one scope take turns across replicas, so a claim is refused
// only when the scope really is full (no false refusals). The scope lock
// is a row lock on pglimit.slot_lock, which no role but pglimit's owner
// may take (an advisory lock, which it was, any role connected to the
// database may take and hold, stalling every claim of the scope; see
// TestNoClaimWaitsOnAnotherRolesLock), with a lock_timeout of half the
// Timeout: a claim that cannot have its turn fails as unavailable (503),
// its connection kept (TestStalledTurnFailsAsUnavailable).
//
// Claims and releases of one Leaser that arrive while its previous round
// trip is in flight wait for it and then travel together, in one batch:
// one claim statement and one commit for all of them, judged in the order
// they arrived. A lone caller pays one round trip on its own goroutine and
// waits for nobody; under load the cost of a round trip is shared (group
// commit). Every caller still learns its own outcome, and a claim is never
// refused because of the company it travelled with.
//
// # Releases
//
// Release sends the release at once, in a round trip of its own (one
// statement, by the primary key of its slots, on the caller's goroutine
// when nothing else of the Leaser is on its way) or in the one about to
// leave (before that batch's claims), and waits until it has
// landed, so that a caller who answered after Release returned has given
// its slots back on every replica: a client that got its answer and sends
// the next request is never refused for the slot it just held. A release
// that travels in a batch with others is waited for until that batch has
// landed. ReleaseBeforeAnswer, the Handlers' release, waits so for as long
// as the database answers within the Leaser's Timeout; only past it does
// the answer go out without the release, which goes on in the background
// (TestSequentialClientNeverRefusedByItsOwnPermit in middleware/heavy,
// TestReleaseBeforeAnswerWaitsForItsBatch here). A claim the
// same Leaser makes while a release is on its way never finds the released
// slots held either: it travels after the release, or, when it raced the
// release's round trip and was refused, it is judged again once the
// release has landed. When the caller's ctx ends first (a client gone),
// Release returns and the release goes on without it. A release that fails
// is logged (Options.Logger) and its slots lapse at the end of their lease;
// so do those of a process killed before its releases were sent — in the
// worst case a slot stays held for the whole lease after its claim. Flush
// waits for the releases still on their way: call it at shutdown, before
// the pool closes, so that a clean shutdown loses none.
//
// A Leaser is safe for concurrent use. It starts no goroutine of its own
// that outlives the work it was given.
package permit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/citus"
	"github.com/pglimit/pglimit/internal/procname"
)

// Kind names the partition of pglimit.slot a Leaser keeps its slots in; the
// kind is the partition's name. A new kind of slot is one migration (a
// partition FOR VALUES IN ('its_name')) and one constant.
type Kind string

const (
	// HeavyPermit is pglimit.heavy_permit (heavy endpoints).
	HeavyPermit Kind = "heavy_permit"
	// RequestInFlight is pglimit.request_in_flight (requests per token).
	RequestInFlight Kind = "request_in_flight"
	// UploadWindow is pglimit.upload_window (uploads per rolling window).
	UploadWindow Kind = "upload_window"
)

// Defaults of Options.
const (
	defaultTimeout  = 5 * time.Second
	defaultMaxBatch = 64
)

// dbtx is what a Leaser runs on: the pool New is given.
type dbtx interface {
	db.DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Scope is one limit a claim must fit in: at most Cap live slots under Key.
type Scope struct {
	// Key names the scope, e.g. "user:sql-console:alice" or "installation".
	Key string
	// Cap is the number of slots of the scope, 1..pglimit.MaxLimit (the
	// slot limiter's New checked it).
	Cap int
	// Kind is the kind of scope a refusal by it is counted in (the
	// attribute scope of pglimit.decisions: user, installation, token);
	// the permits themselves ignore it.
	Kind string
}

// Claim describes what a caller asks for.
type Claim struct {
	// Scopes are the claim's own scope and, optionally, a second scope it
	// shares with other claims (such as an installation-wide cap): one or
	// two scopes, all of them or none. When the claim is refused, the first
	// full scope in this order is the one reported.
	Scopes []Scope
	// Holder says who holds the slots (a user, a token name), for
	// operators.
	Holder string
	// Endpoint says what the slots are for, for operators.
	Endpoint string
	// Lease is how long the slots live if nobody releases them. It must be
	// positive.
	Lease time.Duration
}

// Options configure a Leaser.
type Options struct {
	// Kind is the kind of slot, and so the table the slots live in.
	// Default: HeavyPermit.
	Kind Kind
	// Replica names this replica on every row it writes, for operators.
	// Default: host:pid.
	Replica string
	// Timeout bounds each round trip (a batch of claims and releases),
	// waiting for a scope's lock included, so a database that stops
	// answering fails a claim within it instead of hanging it (the bound
	// is shared by the round trips that start close together, and may end
	// up to Timeout/32 later than Timeout after a round trip's start).
	// Default 5s.
	Timeout time.Duration
	// MaxBatch is the most claims and releases one round trip carries.
	// Default 64.
	MaxBatch int
	// Logger receives the releases that failed (their slots lapse on
	// their own). Default slog.Default(), taken when New runs.
	Logger *slog.Logger
	// OnRelease, when set, is called once for every release after its
	// round trip, with how long the round trip took (the database work of
	// the release) and its error: for metrics.
	// It must not block.
	OnRelease func(took time.Duration, err error)
}

// ErrRefused is matched (errors.Is) by every *RefusedError.
var ErrRefused = errors.New("permit: no free slot")

// RefusedError says which scope had no free slot.
type RefusedError struct {
	// Scope is the first scope of the claim that was full.
	Scope Scope
	// Live is the number of live slots the scope had.
	Live int
	// FirstLapse is how long until the first of those slots lapses on its
	// own (it may be released sooner).
	FirstLapse time.Duration
}

func (e *RefusedError) Error() string {
	return fmt.Sprintf("permit: scope %q is full (%d of %d slots live)", e.Scope.Key, e.Live, e.Scope.Cap)
}

// Is reports whether target is ErrRefused.
func (e *RefusedError) Is(target error) bool { return target == ErrRefused }

// Leaser claims and releases slots of one kind. It is safe for concurrent
// use.
type Leaser struct {
	pool     dbtx
	kind     Kind
	replica  string
	timeout  time.Duration
	maxBatch int
	q        *db.Queries
	log      *slog.Logger
	onRel    func(time.Duration, error)
	bound    coarse         // each round trip's bound: timeout
	answer   coarse         // ReleaseBeforeAnswer's bound: answerWait(timeout)
	citus    citus.Detector // whether claims run on a Citus scope's shard (onShard)

	mu        sync.Mutex
	queue     []*op
	flushers  int                  // goroutines sending batches; at most maxFlushers
	seq       uint64               // ops queued so far
	pending   map[*op]struct{}     // ops queued or in flight (Flush waits for them)
	releasing map[string]int       // scope key -> releases of it in flight
	contended map[string]time.Time // scope key -> until when its claims take the lock first
}

// maxFlushers is how many batches of one Leaser may be in flight at once:
// two keep the database busy while the replica reads the previous answer.
const maxFlushers = 2

// New returns a Leaser over pool. Its options come checked from a slot
// limiter's New (slots.Check): a zero field takes its default.
func New(pool *pgxpool.Pool, opts Options) *Leaser {
	if opts.Kind == "" {
		opts.Kind = HeavyPermit
	}
	if opts.Replica == "" {
		opts.Replica = procname.Default()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = defaultTimeout
	}
	if opts.MaxBatch <= 0 {
		opts.MaxBatch = defaultMaxBatch
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	return &Leaser{pool: pool, kind: opts.Kind, replica: storable(opts.Replica), timeout: opts.Timeout,
		maxBatch: opts.MaxBatch, q: db.New(), log: opts.Logger, onRel: opts.OnRelease, bound: coarse{d: opts.Timeout, own: true},
		answer:  coarse{d: answerWait(opts.Timeout)},
		pending: map[*op]struct{}{}, releasing: map[string]int{}, contended: map[string]time.Time{}}
}

// Lease is a granted claim. Release it when the work it guards ends.
type Lease struct {
	// ID identifies the claim on every row it took (lease_id).
	ID uuid.UUID
	// Slots are the granted slot numbers, in the order of the claim's
	// scopes.
	Slots []int

	leaser  *Leaser
	keys    []string           // the claim's scope keys
	held    []string           // the keys as stored (storedKey)
	slotNos []int              // Slots, as granted
	release atomic.Pointer[op] // the release, once Release was called
}

// Claim takes one slot in every scope of c, or none: c has one or two
// scopes of different keys, made of checked options (the slot limiter's
// New checked them; the Leaser does not again). It returns a
// *RefusedError (errors.Is(err, ErrRefused)) when a scope is full; any other
// error is the database's, or ctx's. A claim whose caller's ctx ends while
// its round trip is in flight is given back as soon as it is granted.
func (l *Leaser) Claim(ctx context.Context, c Claim) (*Lease, error) {
	o := &op{claim: &c, id: uuid.New(), done: make(chan struct{})}
	if err := l.wait(ctx, o); err != nil {
		return nil, err
	}
	if o.err != nil {
		return nil, fmt.Errorf("permit: claim in %s: %w", l.kind, o.err)
	}
	if o.refused != nil {
		return nil, o.refused
	}
	keys, held := make([]string, len(c.Scopes)), make([]string, len(c.Scopes))
	for i, s := range c.Scopes {
		keys[i], held[i] = s.Key, o.claim.Scopes[i].Key
	}
	return &Lease{ID: o.id, Slots: o.slots, leaser: l, keys: keys, held: held, slotNos: slices.Clone(o.slots)}, nil
}

// Release gives back every slot of the lease and waits until the
// database has them back, or ctx ends. The release travels at once, in a
// round trip of its own or in the one about to leave, before its claims;
// when ctx ends first it goes on without the caller (Leaser.Flush waits
// for it). It returns the release's error, if any (pglimit.Classify): the
// slots then lapse on their own at the end of the lease (Claim.Lease after
// the claim), as they do when the process is killed before the release is
// sent. It is safe to call more than once: only the first call releases,
// and every call waits for that release and returns its outcome. It is
// safe after the lease lapsed: it never deletes a slot someone else has
// claimed since.
func (l *Lease) Release(ctx context.Context) error { return l.releaseBy(ctx, nil) }

// releaseBy is Release that also stops waiting when bound ends (nil: it
// never does), with bound's error.
func (l *Lease) releaseBy(ctx, bound context.Context) error {
	if l == nil || l.leaser == nil {
		return nil
	}
	o := l.release.Load()
	if o == nil {
		mine := &op{release: l.held, slotNos: l.slotNos, id: l.ID, done: make(chan struct{})}
		if l.release.CompareAndSwap(nil, mine) {
			rctx := ctx
			if bound != nil {
				var stop func()
				rctx, stop = either(ctx, bound)
				defer stop()
			}
			l.leaser.releaseNow(rctx, mine)
		}
		o = l.release.Load()
	}
	var boundDone <-chan struct{}
	if bound != nil {
		boundDone = bound.Done()
	}
	select {
	case <-o.done:
	case <-ctx.Done():
		select {
		case <-o.done: // landed as ctx ended: keep the outcome
		default:
			return ctx.Err()
		}
	case <-boundDone:
		select {
		case <-o.done:
		default:
			return bound.Err()
		}
	}
	if o.err != nil {
		return fmt.Errorf("permit: release in %s: %w", l.leaser.kind, o.err)
	}
	return nil
}

// ReleaseWithin is Release waiting at most d (and no longer than ctx):
// past d the release goes on without the caller.
func (l *Lease) ReleaseWithin(ctx context.Context, d time.Duration) error {
	if l == nil || l.leaser == nil {
		return nil
	}
	bound, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	return l.releaseBy(ctx, bound)
}

// ReleaseBeforeAnswer is the release a Handler makes before its answer
// completes: Release waiting for as long as the database answers within
// the Leaser's Timeout (and no longer than ctx, the client's). It waits
// for the round trip that carries the release — its own, or a batch
// shared with other releases and claims — until it lands, or fails, or
// the Timeout less a sixteenth has passed (between that and the Timeout
// itself, with no timer of its own): so a database that does not answer
// delays the answer by less than the Timeout, and the release's own round
// trip, bounded by the whole Timeout, is still on its way then and goes on
// in the background (Flush waits for it); should it fail too, the slots
// lapse at the end of their lease. A client that reads the answer and then
// sends its next request so never finds its own slot held while the
// database answers within the Timeout, however slow the machine.
func (l *Lease) ReleaseBeforeAnswer(ctx context.Context) error {
	if l == nil || l.leaser == nil {
		return nil
	}
	return l.releaseBy(ctx, l.leaser.answer.get())
}

// answerWait is how long ReleaseBeforeAnswer waits at most for a Leaser
// of this Timeout, less the coarse timer's slack (a thirty-second of it):
// the Timeout less a sixteenth, so that the wait ends before the round trip
// that carries the release is cut by its own bound (at least the Timeout
// after it starts): the release is then still on its way, and goes on
// without the caller.
func answerWait(timeout time.Duration) time.Duration { return timeout - timeout/16 }

// ScopeKey joins parts into a scope key, escaping the separator so that
// ("a:b", "c") and ("a", "b:c") never name the same scope.
func ScopeKey(parts ...string) string {
	plain := true
	for _, p := range parts {
		plain = plain && !strings.ContainsAny(p, `\:`)
	}
	if plain {
		return strings.Join(parts, ":")
	}
	esc := make([]string, len(parts))
	for i, p := range parts {
		esc[i] = keyEscaper.Replace(p)
	}
	return strings.Join(esc, ":")
}

// keyEscaper escapes the separator of ScopeKey's parts (and the escape).
var keyEscaper = strings.NewReplacer(`\`, `\\`, `:`, `\:`)

// storable makes a text the database stores whatever it holds: valid UTF-8
// without NUL (PostgreSQL text refuses both), at most 200 bytes.
func storable(s string) string {
	s = strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
	if len(s) > 200 {
		s = strings.ToValidUTF8(s[:200], "")
	}
	return s
}
