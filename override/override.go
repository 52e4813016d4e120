// Package override keeps limits as data: a per-key limit for a named
// policy (a customer's plan, a tenant's contract, a trial), set, listed and
// removed while the service runs, in force on every replica within a
// second, without a restart. A limiter given a Store (quota.Options.Overrides)
// asks it for a key's limit on every decision and gets it from memory: an
// override costs no statement on the request path.
//
// # Where they live
//
// Overrides are rows of pglimit.limit_override, a LOGGED table (an
// operator's configuration survives a crash, unlike the counts of the
// limit tables). Every Store holds all of them in memory, loaded when it is
// made and kept current while its Run runs (run it beside pglimit.Run,
// until shutdown: without it a Store never hears another replica's
// change). Set and Remove write the row and, in the same transaction, send
// an invalidation on pglimit's bus (LISTEN/NOTIFY, authenticated: another
// role of the database cannot forge one): every replica's running Store
// reloads that one key when it hears it, within milliseconds. While the bus is not
// Live (a proxy that does not pass notifications, a broken listener), and
// whenever it turns Live again, the Store reloads everything once a second
// instead: a change is in force everywhere within a second either way
// (TestOverridesAcrossReplicas, TestReloadWithoutBus).
//
// # Expiry
//
// An override may end on its own (Set's ttl): it stops applying at its
// time, judged against the database clock (the Store keeps the offset of
// the replica's clock to the database's), with no reload.
//
// What it costs: one statement per change and per replica one statement
// per change heard; a read is a map lookup (BenchmarkLimit). What it holds:
// every override in every replica's memory, about 100 bytes each.
package override

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/vocab"
)

// maxLimit is the largest limit an override takes: 2^53, quota.MaxLimit.
const maxLimit = vocab.MaxAmount

// ErrInvalid is returned, wrapped with what was wrong, for a policy, key,
// limit or ttl Set cannot store.
var ErrInvalid = errors.New("override: invalid override")

// Override is one key's limit under a policy.
type Override struct {
	// Policy is the limit it overrides: a quota's or a rate policy's name.
	Policy string
	// Key is whose limit it is (a user, a tenant, a token, an address).
	Key string
	// Limit replaces the policy's limit for the key; 0 allows nothing.
	Limit int64
	// ExpiresAt is when it stops applying (database clock); zero: never.
	ExpiresAt time.Time
	// UpdatedAt is when it was set (database clock).
	UpdatedAt time.Time
}

// Options configure a Store. The zero value is ready to use.
type Options struct {
	// Poll is how often the Store reloads everything while the bus is not
	// Live. Default one second.
	Poll time.Duration
	// Timeout bounds one statement. Default 5s.
	Timeout time.Duration
	// Logger receives failed reloads. Default slog.Default().
	Logger *slog.Logger
}

// Store holds every override in memory; Run keeps it current. It is safe
// for concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	poll    time.Duration
	timeout time.Duration
	log     *slog.Logger

	cur  atomic.Pointer[snapshot]
	mu   sync.Mutex // serialises writes of cur
	skew atomic.Int64

	sub     *bus.Subscription
	keys    chan string
	running atomic.Bool
}

type entry struct {
	limit   int64
	expires time.Time // zero: never
}

type snapshot struct {
	m     map[string]entry // policy + "\x00" + key
	epoch uint64
}

func mapKey(policy, key string) string { return policy + "\x00" + key }

// New loads every override from pool's database (pglimit's schema
// migrated) and returns them; Run keeps them current. A change made while
// it loads is not lost: Run hears it.
func New(ctx context.Context, pool *pgxpool.Pool, o Options) (*Store, error) {
	if pool == nil {
		return nil, errors.New("override: nil pool")
	}
	if o.Poll < 0 || o.Timeout < 0 {
		return nil, errors.New("override: negative Poll or Timeout")
	}
	if o.Poll == 0 {
		o.Poll = time.Second
	}
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	s := &Store{pool: pool, q: db.New(), poll: o.Poll, timeout: o.Timeout, log: o.Logger,
		keys: make(chan string, 256)}
	s.cur.Store(&snapshot{m: map[string]entry{}})
	b := bus.For(pool)
	// Subscribe before loading: a change made while loading is heard.
	s.sub = b.Subscribe(bus.TopicOverride, func(k string) {
		select {
		case s.keys <- k:
		default: // too many at once: reload everything
			select {
			case s.keys <- "":
			default:
			}
		}
	}, func() {
		select {
		case s.keys <- "":
		default:
		}
	})
	if err := s.loadAll(ctx, b.Epoch()); err != nil {
		s.sub.Close()
		return nil, err
	}
	return s, nil
}

// Run keeps the overrides current until ctx ends, and returns nil then:
// it reloads everything when it starts, then a key when the bus says it
// changed (pglimit.Run runs the bus
// for pool), and everything once per Options.Poll while the bus is not
// Live and whenever it turns Live again. Without Run, Limit answers from
// what New loaded and this replica's own Set and Remove. Run may be called
// once; a second call returns an error at once.
func (s *Store) Run(ctx context.Context) error {
	if !s.running.CompareAndSwap(false, true) {
		return errors.New("override: Run called twice")
	}
	defer s.sub.Close()
	b := bus.For(s.pool)
	// Everything once more: a change heard between New and Run may have
	// been dropped with its queue full.
	if err := s.loadAll(ctx, b.Epoch()); err != nil && ctx.Err() == nil {
		s.log.WarnContext(ctx, "override: reload failed; trying again within a second", "err", err)
		s.forceReload()
	}
	t := time.NewTicker(s.poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case k := <-s.keys:
			policy, key, ok := strings.Cut(k, "/")
			var err error
			if !ok || k == "" {
				err = s.loadAll(ctx, b.Epoch())
			} else {
				err = s.loadOne(ctx, policy, key)
			}
			if err != nil && ctx.Err() == nil {
				s.log.WarnContext(ctx, "override: reload failed; trying again within a second", "err", err)
				s.forceReload() // the next tick reloads everything
			}
		case <-t.C:
			snap := s.cur.Load()
			if !b.Live() || snap.epoch != b.Epoch() {
				if err := s.loadAll(ctx, b.Epoch()); err != nil && ctx.Err() == nil {
					s.log.WarnContext(ctx, "override: reload failed; trying again within a second", "err", err)
				}
			}
		}
	}
}

// forceReload makes the next tick reload everything (an epoch no bus
// has).
func (s *Store) forceReload() {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	s.cur.Store(&snapshot{m: old.m, epoch: ^uint64(0)})
}

func (s *Store) loadAll(ctx context.Context, epoch uint64) error {
	ctx, cancel := dberr.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.OverrideAll(ctx, s.pool)
	if err != nil {
		return fmt.Errorf("override: load: %w", dberr.OwnTimeout(ctx, err))
	}
	m := make(map[string]entry, len(rows))
	for _, r := range rows {
		m[mapKey(r.Policy, r.Key)] = entry{limit: r.Limit, expires: timeOf(r.ExpiresAt)}
		s.skew.Store(int64(time.Until(r.Now)))
	}
	s.mu.Lock()
	s.cur.Store(&snapshot{m: m, epoch: epoch})
	s.mu.Unlock()
	return nil
}

func (s *Store) loadOne(ctx context.Context, policy, key string) error {
	ctx, cancel := dberr.WithTimeout(ctx, s.timeout)
	defer cancel()
	r, err := s.q.OverrideGet(ctx, s.pool, &db.OverrideGetParams{Policy: policy, Key: key})
	if errors.Is(err, pgx.ErrNoRows) {
		s.apply(policy, key, nil)
		return nil
	}
	if err != nil {
		return fmt.Errorf("override: load %s/%s: %w", policy, key, dberr.OwnTimeout(ctx, err))
	}
	s.skew.Store(int64(time.Until(r.Now)))
	s.apply(policy, key, &entry{limit: r.Limit, expires: timeOf(r.ExpiresAt)})
	return nil
}

// apply replaces one key's entry (nil: removes it), copying the map: reads
// never lock.
func (s *Store) apply(policy, key string, e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.cur.Load()
	m := maps.Clone(old.m)
	if e == nil {
		delete(m, mapKey(policy, key))
	} else {
		m[mapKey(policy, key)] = *e
	}
	s.cur.Store(&snapshot{m: m, epoch: old.epoch})
}

func timeOf(t pgtype.Timestamptz) time.Time {
	if !t.Valid {
		return time.Time{}
	}
	return t.Time
}

// Limit returns key's limit under policy when it has an override in force,
// from memory.
func (s *Store) Limit(policy, key string) (int64, bool) {
	e, ok := s.cur.Load().m[mapKey(policy, key)]
	if !ok {
		return 0, false
	}
	if !e.expires.IsZero() && !time.Now().Add(time.Duration(s.skew.Load())).Before(e.expires) {
		return 0, false
	}
	return e.limit, true
}

func check(policy, key string) error {
	switch {
	case policy == "" || len(policy) > 200 || !utf8.ValidString(policy) || strings.ContainsAny(policy, "/\x00\n"):
		return fmt.Errorf("%w: policy must be 1 to 200 bytes of UTF-8 without '/', NUL or newline", ErrInvalid)
	case key == "" || len(key) > 1000 || !utf8.ValidString(key) || strings.ContainsAny(key, "\x00\n"):
		return fmt.Errorf("%w: key must be 1 to 1000 bytes of UTF-8 without NUL or newline", ErrInvalid)
	}
	return nil
}

// Set gives key the limit under policy (replacing an earlier override),
// until ttl has passed (0: until removed), and tells every replica. It is
// in force on this replica when Set returns, on the others within a
// second.
func (s *Store) Set(ctx context.Context, policy, key string, limit int64, ttl time.Duration) (Override, error) {
	if err := check(policy, key); err != nil {
		return Override{}, err
	}
	if limit < 0 || limit > maxLimit {
		return Override{}, fmt.Errorf("%w: limit %d is not between 0 and %d", ErrInvalid, limit, int64(maxLimit))
	}
	if ttl < 0 {
		return Override{}, fmt.Errorf("%w: negative ttl", ErrInvalid)
	}
	ctx, cancel := dberr.WithTimeout(ctx, s.timeout)
	defer cancel()
	var out Override
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var within pgtype.Interval
		if ttl > 0 {
			within = pgtype.Interval{Microseconds: ttl.Microseconds(), Valid: true}
		}
		r, err := s.q.OverrideSet(ctx, tx, &db.OverrideSetParams{Policy: policy, Key: key, MaxLimit: limit, Ttl: within})
		if err != nil {
			return err
		}
		out = Override{Policy: r.Policy, Key: r.Key, Limit: r.Limit, ExpiresAt: timeOf(r.ExpiresAt), UpdatedAt: r.UpdatedAt}
		return s.q.BusNotify(ctx, tx, bus.TopicOverride+"\n"+policy+"/"+key)
	})
	if err != nil {
		return Override{}, fmt.Errorf("override: set: %w", dberr.OwnTimeout(ctx, err))
	}
	s.apply(policy, key, &entry{limit: out.Limit, expires: out.ExpiresAt})
	return out, nil
}

// Remove removes key's override under policy and tells every replica. It
// reports whether there was one.
func (s *Store) Remove(ctx context.Context, policy, key string) (bool, error) {
	if err := check(policy, key); err != nil {
		return false, err
	}
	ctx, cancel := dberr.WithTimeout(ctx, s.timeout)
	defer cancel()
	var n int64
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		var err error
		if n, err = s.q.OverrideDelete(ctx, tx, &db.OverrideDeleteParams{Policy: policy, Key: key}); err != nil || n == 0 {
			return err
		}
		return s.q.BusNotify(ctx, tx, bus.TopicOverride+"\n"+policy+"/"+key)
	})
	if err != nil {
		return false, fmt.Errorf("override: remove: %w", dberr.OwnTimeout(ctx, err))
	}
	s.apply(policy, key, nil)
	return n > 0, nil
}

// List returns policy's overrides in force, in key order after the key
// after ("" for the first page), at most max (1 to 1000).
func (s *Store) List(ctx context.Context, policy, after string, max int) ([]Override, error) {
	if max < 1 || max > 1000 {
		return nil, fmt.Errorf("%w: max %d is not between 1 and 1000", ErrInvalid, max)
	}
	ctx, cancel := dberr.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.q.OverrideList(ctx, s.pool, &db.OverrideListParams{Policy: policy, After: after, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("override: list: %w", dberr.OwnTimeout(ctx, err))
	}
	out := make([]Override, 0, len(rows))
	for _, r := range rows {
		out = append(out, Override{Policy: r.Policy, Key: r.Key, Limit: r.Limit, ExpiresAt: timeOf(r.ExpiresAt), UpdatedAt: r.UpdatedAt})
	}
	return out, nil
}
