// Package permit keeps leased slots in PostgreSQL: the one mechanism under
// pglimit's heavy-request permits, its per-token in-flight cap and its
// upload window.
//
// A Claim asks for one slot in each of several scopes (for a heavy request:
// the user's scope of the endpoint and the installation's scope) and gets
// all of them or none, in one round trip: a pgx Batch that takes a
// transaction-scoped advisory lock per scope and then runs one
// INSERT ... ON CONFLICT DO UPDATE ... WHERE expired over
// generate_series(1, cap). The lock makes claims of one scope take turns, so
// a claim is refused only when the scope really is full (no false refusals)
// and the primary key (scope, slot) makes a second holder of a slot
// impossible (no over-grants). Every slot carries the database-clock time at
// which it lapses on its own, so a replica that dies holds nobody's limit
// for longer than its lease. Release gives every slot of a claim back in one
// statement.
//
// The SQL is in sql/queries/heavy_permit.sql (and the same statements over
// request_in_flight and upload_window). A Leaser needs no HTTP: a job runner
// or a CLI can use it as it is.
package permit

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/db"
)

// Table is the limit table a Leaser keeps its slots in.
type Table int

const (
	// HeavyPermit is the heavy_permit table (heavy endpoints).
	HeavyPermit Table = iota
	// RequestInFlight is the request_in_flight table (requests per token).
	RequestInFlight
	// UploadWindow is the upload_window table (uploads per rolling hour).
	UploadWindow
)

func (t Table) String() string {
	switch t {
	case HeavyPermit:
		return "heavy_permit"
	case RequestInFlight:
		return "request_in_flight"
	case UploadWindow:
		return "upload_window"
	}
	return fmt.Sprintf("Table(%d)", int(t))
}

// DB is what a Leaser runs on: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
// A Leaser meant to outlive a request's transaction should be given the
// pool: a claim on the request's transaction would be rolled back with it.
type DB interface {
	db.DBTX
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Scope is one limit a claim must fit in: at most Cap live slots under Key.
type Scope struct {
	// Key names the scope, e.g. "user:sql-console:alice" or "installation".
	Key string
	// Cap is the number of slots of the scope; it must be at least 1.
	Cap int
}

// Claim describes what a caller asks for.
type Claim struct {
	// Scopes are the limits the claim must fit in, all of them or none.
	// The first refused scope, in this order, is the one reported.
	Scopes []Scope
	// Holder says who holds the slots (a user, a token name), for operators.
	Holder string
	// Endpoint says what the slots are for, for operators.
	Endpoint string
	// Lease is how long the slots live if nobody releases them. It must be
	// positive.
	Lease time.Duration
}

// Options configure a Leaser.
type Options struct {
	// Table is the table the slots live in. Default: HeavyPermit.
	Table Table
	// Replica names this replica on every row it writes, for operators.
	// Default: host:pid.
	Replica string
}

// ErrRefused is matched (errors.Is) by every *RefusedError.
var ErrRefused = errors.New("permit: no free slot")

// ErrInvalidClaim is returned for a claim that could never be granted: no
// scopes, an empty key, a cap below 1 or a lease that is not positive.
var ErrInvalidClaim = errors.New("permit: invalid claim")

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

// Leaser claims and releases slots in one table. It is safe for concurrent
// use.
type Leaser struct {
	pool    DB
	table   Table
	replica string
	q       *db.Queries
}

// New returns a Leaser over pool.
func New(pool DB, opts Options) (*Leaser, error) {
	if pool == nil {
		return nil, errors.New("permit: nil pool")
	}
	switch opts.Table {
	case HeavyPermit, RequestInFlight, UploadWindow:
	default:
		return nil, fmt.Errorf("permit: unknown table %v", opts.Table)
	}
	if opts.Replica == "" {
		opts.Replica = DefaultReplicaName()
	}
	return &Leaser{pool: pool, table: opts.Table, replica: opts.Replica, q: db.New()}, nil
}

// DefaultReplicaName is host:pid.
func DefaultReplicaName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// Table returns the table the Leaser writes.
func (l *Leaser) Table() Table { return l.table }

// Lease is a granted claim. Release it when the work it guards ends.
type Lease struct {
	// ID identifies the claim on every row it took (lease_id).
	ID uuid.UUID
	// Slots are the granted slot numbers, in the order of the claim's
	// scopes.
	Slots []int

	leaser *Leaser
	keys   []string
}

// Claim takes one slot in every scope of c, or none. It returns a
// *RefusedError (errors.Is(err, ErrRefused)) when a scope is full; any other
// error is the database's.
func (l *Leaser) Claim(ctx context.Context, c Claim) (*Lease, error) {
	if len(c.Scopes) == 0 || c.Lease <= 0 {
		return nil, ErrInvalidClaim
	}
	keys := make([]string, len(c.Scopes))
	caps := make([]int32, len(c.Scopes))
	for i, s := range c.Scopes {
		if s.Key == "" || s.Cap < 1 || s.Cap > 1<<20 {
			return nil, ErrInvalidClaim
		}
		keys[i], caps[i] = s.Key, int32(s.Cap)
	}
	id := uuid.New()
	params := &db.HeavyPermitClaimParams{
		Scopes:   keys,
		Caps:     caps,
		LeaseID:  id,
		Holder:   c.Holder,
		Endpoint: c.Endpoint,
		Replica:  l.replica,
		LeaseMs:  c.Lease.Milliseconds(),
	}
	// The lock and the claim travel in one batch: one round trip, one
	// implicit transaction. See sql/queries/heavy_permit.sql.
	b := &batch{conn: l.pool}
	rows, err := l.claim(ctx, b, params)
	if err == nil {
		err = b.closeErr
	}
	if err != nil {
		return nil, fmt.Errorf("permit: claim in %s: %w", l.table, err)
	}
	if len(rows) != len(c.Scopes) {
		return nil, fmt.Errorf("permit: claim in %s returned %d rows for %d scopes", l.table, len(rows), len(c.Scopes))
	}
	slots := make([]int, len(rows))
	granted := 0
	for i, r := range rows {
		slots[i] = int(r.GrantedSlot)
		if r.GrantedSlot > 0 {
			granted++
		}
	}
	if granted == len(rows) {
		return &Lease{ID: id, Slots: slots, leaser: l, keys: keys}, nil
	}
	if granted > 0 {
		// Cannot happen while the scope locks are held (the statement grants
		// all or none), but a partial grant must never be kept.
		lease := &Lease{ID: id, leaser: l, keys: keys}
		_ = lease.Release(context.WithoutCancel(ctx))
	}
	refused := 0
	for i, r := range rows {
		if r.Live >= r.Cap {
			refused = i
			break
		}
	}
	r := rows[refused]
	return nil, &RefusedError{
		Scope:      c.Scopes[refused],
		Live:       int(r.Live),
		FirstLapse: time.Duration(r.FirstLapseMs) * time.Millisecond,
	}
}

// Release gives back every slot of the lease in one statement. It is safe to
// call more than once and after the lease lapsed: it never deletes a slot
// someone else has claimed since. Call it with a context that outlives the
// request (context.WithoutCancel) so a client that went away still frees
// its slots.
func (l *Lease) Release(ctx context.Context) error {
	if l == nil || l.leaser == nil {
		return nil
	}
	if _, err := l.leaser.release(ctx, l.keys, l.ID); err != nil {
		return fmt.Errorf("permit: release in %s: %w", l.leaser.table, err)
	}
	return nil
}

// Keys are the scope keys the lease holds slots in.
func (l *Lease) Keys() []string { return append([]string(nil), l.keys...) }

// claim runs the table's lock and claim statements on x. The generated
// parameter and row types of the three tables are identical structs, so
// they convert into one another.
func (l *Leaser) claim(ctx context.Context, x db.DBTX, p *db.HeavyPermitClaimParams) ([]*db.HeavyPermitClaimRow, error) {
	switch l.table {
	case RequestInFlight:
		if err := l.q.RequestInFlightLockScopes(ctx, x, p.Scopes); err != nil {
			return nil, err
		}
		rows, err := l.q.RequestInFlightClaim(ctx, x, (*db.RequestInFlightClaimParams)(p))
		out := make([]*db.HeavyPermitClaimRow, len(rows))
		for i, r := range rows {
			out[i] = (*db.HeavyPermitClaimRow)(r)
		}
		return out, err
	case UploadWindow:
		if err := l.q.UploadWindowLockScopes(ctx, x, p.Scopes); err != nil {
			return nil, err
		}
		rows, err := l.q.UploadWindowClaim(ctx, x, (*db.UploadWindowClaimParams)(p))
		out := make([]*db.HeavyPermitClaimRow, len(rows))
		for i, r := range rows {
			out[i] = (*db.HeavyPermitClaimRow)(r)
		}
		return out, err
	default:
		if err := l.q.HeavyPermitLockScopes(ctx, x, p.Scopes); err != nil {
			return nil, err
		}
		return l.q.HeavyPermitClaim(ctx, x, p)
	}
}

func (l *Leaser) release(ctx context.Context, keys []string, id uuid.UUID) (int64, error) {
	switch l.table {
	case RequestInFlight:
		return l.q.RequestInFlightRelease(ctx, l.pool, &db.RequestInFlightReleaseParams{Scopes: keys, LeaseID: id})
	case UploadWindow:
		return l.q.UploadWindowRelease(ctx, l.pool, &db.UploadWindowReleaseParams{Scopes: keys, LeaseID: id})
	default:
		return l.q.HeavyPermitRelease(ctx, l.pool, &db.HeavyPermitReleaseParams{Scopes: keys, LeaseID: id})
	}
}

// ScopeKey joins parts into a scope key, escaping the separator so that
// ("a:b", "c") and ("a", "b:c") never name the same scope.
func ScopeKey(parts ...string) string {
	esc := make([]string, len(parts))
	for i, p := range parts {
		esc[i] = strings.NewReplacer(`\`, `\\`, `:`, `\:`).Replace(p)
	}
	return strings.Join(esc, ":")
}
