package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/quota"
	"github.com/pglimit/pglimit/ratelimit"
)

// Kind says what a path is.
type Kind string

// Kinds of path.
const (
	// Baseline is something pglimit is compared with.
	Baseline Kind = "baseline"
	// Limit is one of pglimit's limit paths.
	Limit Kind = "pglimit"
	// Page is a history page read.
	Page Kind = "page"
)

// Path is one thing measured.
type Path struct {
	// Name is the path's name in tables and charts.
	Name string
	// Kind says what it is.
	Kind Kind
	// What says what one operation does.
	What string
	// New makes the op of loop worker (its own user, token, key).
	New func(worker int) (Op, error)
	// Slow paths run at least a few operations per loop whatever the
	// duration.
	Slow bool
}

// Names of the baseline paths.
const (
	NameSelect1   = "SELECT 1 (floor)"
	NameSemaphore = "in-process semaphore"
	NameRedisRate = "redis_rate Allow"
	// NameUpsert is the floor of any counter kept in PostgreSQL.
	NameUpsert = "one-row upsert (floor)"
	// NameRateLimit and NameRateLimit2 are the rate limit's decisions,
	// with one policy and with two.
	NameRateLimit  = "rate limit decision"
	NameRateLimit2 = "rate limit, two policies"
	// NameBorrowed and NameFromMemory are the rate limit's decisions that
	// need no statement: a unit spent from a borrowed batch, and a
	// refusal answered from memory.
	NameBorrowed   = "rate limit decision, borrowed"
	NameFromMemory = "rate limit refusal, from memory"
	// NameAccessMatch is a request matched against the allow and deny
	// lists (package access) at AccessRules rules: no statement.
	NameAccessMatch = "allow/deny list match, 10,000 rules"
	// NameClientAddr is deriving a request's client address (package
	// clientaddr) behind a trusted proxy: no statement.
	NameClientAddr = "client address, through a trusted proxy"
	// NameBanned is a banned key's refusal (package ban): from memory,
	// before the rate is looked at.
	NameBanned = "banned key refusal"
	// NameStrictFailure and NameStrictSuccess are a failed and a
	// successful sign-in in strict mode, the default.
	NameStrictFailure = "failed sign-in, strict"
	NameStrictSuccess = "successful sign-in, strict"
	// NameUpsertTx is the floor of a charge that commits with the
	// caller's write: BEGIN, one upsert of a LOGGED row, COMMIT.
	NameUpsertTx = "one-row logged upsert in a transaction (floor)"
	// NameQuota, NameQuotaSettle and NameQuotaTx are the calendar quota's
	// charge, a charge settled after the fact, and a charge in the
	// caller's transaction on the LOGGED ledger.
	NameQuota       = "calendar quota charge"
	NameQuotaSettle = "calendar quota charge+settle"
	NameQuotaTx     = "quota charge in the caller's transaction"
	// NameNode is the node limiter's path, the one limit path without a
	// database round trip.
	NameNode = "node limiter call"
)

// RedisRate, when set, makes redis_rate's Allow on the Redis at addr a
// baseline: the op of a loop, a func releasing the client, and a note
// naming the server or saying why there is none. cmd/internal/redisrate
// sets it, so Redis stays out of the library's module.
var RedisRate func(ctx context.Context, addr string) (op func(worker int) Op, closeIt func(), note string)

// Suite holds what the paths run on. Close it when done.
type Suite struct {
	Pool *pgxpool.Pool
	// Rows is the size of the page fixture; 0 leaves the page paths out.
	Rows int
	// RedisAddr is the Redis of the redis_rate baseline; "" leaves it out.
	RedisAddr string
	// RedisNote says why the Redis baseline is missing, when it is.
	RedisNote string

	heavy   *heavy.Limiter
	signin  *signin.Limiter
	failure *signin.Limiter
	upload  *upload.Limiter
	flight  *inflight.Limiter
	rate    *ratelimit.Limiter
	borrow  *ratelimit.Limiter
	refuse  *ratelimit.Limiter
	access  *access.Rules
	banned  *ratelimit.Limiter
	strict  *signin.Limiter
	quota   *quota.Limiter
	ledger  *quota.Limiter
	node    *nodelimit.Node
	nodes   *nodelimit.Limiter
	sem     *semaphore.Weighted
	redis   func(worker int) Op
	closeR  func()
	stopBus func()
	pager   *cursor.Pager
	run     string
	uploads atomic.Int64
}

// HeavyEndpoint is the Options of the heavy path's endpoint: its per-user
// cap is never reached (each loop is its own user).
var HeavyEndpoint = heavy.Options{Name: "bench", Limit: 2, Time: 30 * time.Second}

// NewSuite makes the limiters of every path over pool, which must have
// pglimit's schema. The installation-wide heavy cap is set above the
// loops, so nothing is refused: what is measured is the cost of a grant.
func NewSuite(ctx context.Context, pool *pgxpool.Pool, rows int, redisAddr string) (*Suite, error) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	s := &Suite{Pool: pool, Rows: rows, RedisAddr: redisAddr, run: strconv.FormatInt(time.Now().UnixNano(), 36)}
	var err error
	heavyOpts := HeavyEndpoint
	heavyOpts.Key = func(*http.Request) (string, bool) { return "", false }
	heavyOpts.InstallationLimit, heavyOpts.Replica, heavyOpts.Logger = 32, "bench", quiet
	if s.heavy, err = heavy.New(pool, heavyOpts); err != nil {
		return nil, err
	}
	if s.signin, err = signin.New(pool, signin.Options{Lenient: true, Logger: quiet}); err != nil {
		return nil, err
	}
	// Failures never reach the limit (the path moves to a new key every
	// failuresPerKey): every attempt is recorded.
	if s.failure, err = signin.New(pool, signin.Options{Lenient: true, Limit: vocab.MaxLimit, Logger: quiet}); err != nil {
		return nil, err
	}
	if s.strict, err = signin.New(pool, signin.Options{Limit: vocab.MaxLimit, Logger: quiet}); err != nil {
		return nil, err
	}
	if s.upload, err = upload.New(pool, upload.Options{
		Key: func(*http.Request) (string, bool) { return "", false }, Replica: "bench", Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if s.flight, err = inflight.New(pool, inflight.Options{
		Key: func(*http.Request) (string, bool) { return "", false }, Replica: "bench", Logger: quiet,
	}); err != nil {
		return nil, err
	}
	if s.nodes, err = nodelimit.New(nodelimit.Options{Rate: rate.Inf, Logger: quiet}); err != nil {
		return nil, err
	}
	if s.node, err = s.nodes.Node("bench"); err != nil {
		return nil, err
	}
	if err := BuildCounter(ctx, pool); err != nil {
		return nil, err
	}
	// The rate limit's policies are the most a policy allows: with a key
	// per loop, nothing is refused and what is measured is a grant.
	if s.rate, err = ratelimit.New(pool, ratelimit.Options{
		Name: "bench", Logger: quiet,
		Policies: []ratelimit.Policy{RatePolicies[0]},
	}); err != nil {
		return nil, err
	}
	// Borrowing: a policy as fast as a policy goes (a million a second),
	// a key per loop, so each loop's key is hot and never refused.
	if s.borrow, err = ratelimit.New(pool, ratelimit.Options{
		Name: "bench-borrow", Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1_000_000, Window: time.Second}},
	}); err != nil {
		return nil, err
	}
	// Refusals from memory: one unit an hour; a loop's key is refused
	// from its second decision on, and remembered for the hour.
	if s.refuse, err = ratelimit.New(pool, ratelimit.Options{
		Name: "bench-refuse", Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "hourly", Limit: 1, Window: time.Hour}},
	}); err != nil {
		return nil, err
	}
	// Bans: a key refused once (one unit an hour) is banned for the hour.
	bans, err := ban.New(pool, ban.Options{After: 1, Within: time.Hour, For: time.Hour})
	if err != nil {
		return nil, err
	}
	if s.banned, err = ratelimit.New(pool, ratelimit.Options{
		Name: "bench-ban", Logger: quiet,
		Policies: []ratelimit.Policy{{Name: "hourly", Limit: 1, Window: time.Hour}}, Ban: bans,
	}); err != nil {
		return nil, err
	}
	// The invalidation bus, as pglimit.Run runs it: refusals are answered
	// from memory only while it is live.
	if s.stopBus, err = pgtest.RunBuses(context.Background(), quiet, pool); err != nil {
		return nil, fmt.Errorf("bench: %w", err)
	}
	if s.access, err = accessRules(ctx, pool); err != nil {
		return nil, err
	}
	s.sem = semaphore.NewWeighted(64)
	if s.quota, err = quota.New(pool, quota.Options{Name: "bench", Limit: quota.MaxLimit, Period: quota.Month, Logger: quiet}); err != nil {
		return nil, err
	}
	if s.ledger, err = quota.New(pool, quota.Options{Name: "bench", Limit: quota.MaxLimit, Period: quota.Month, Durable: true, Logger: quiet}); err != nil {
		return nil, err
	}
	if s.pager, err = cursor.NewPager(nil, cursor.Rules{}); err != nil {
		return nil, err
	}
	if redisAddr != "" && RedisRate != nil {
		s.redis, s.closeR, s.RedisNote = RedisRate(ctx, redisAddr)
	} else if redisAddr != "" {
		s.RedisNote = "no redis_rate baseline in this binary (cmd/benchreport has it: make bench)"
	} else {
		s.RedisNote = "no Redis address given"
	}
	return s, nil
}

// Close releases what the suite holds (not the pool).
func (s *Suite) Close() {
	if s.closeR != nil {
		s.closeR()
	}
	if s.borrow != nil {
		_ = s.borrow.Flush(context.Background())
	}
	if s.stopBus != nil {
		s.stopBus()
	}
}

// RatePolicies are the policies of the rate limit paths (the first alone,
// or both): as high as a policy goes, and each loop spreads its requests
// over RateKeys keys, so a loop is never refused.
var RatePolicies = []ratelimit.Policy{
	{Name: "first", Limit: 10000, Window: time.Second},
	{Name: "second", Limit: 10000, Window: time.Second},
}

// RateKeys is the number of keys each loop of a rate limit path takes
// turns on.
const RateKeys = 4

// Baselines are SELECT 1 on the pool, the one-row upsert, the in-process
// semaphore and, when Redis answers, redis_rate.
func (s *Suite) Baselines() []Path {
	ps := []Path{
		{Name: NameSelect1, Kind: Baseline, What: "db.SessionPing: one SELECT 1 round trip on the same pool",
			New: func(int) (Op, error) {
				return func(ctx context.Context) error { return db.New().SessionPing(ctx, s.Pool) }, nil
			}},
		{Name: NameUpsert, Kind: Baseline, What: "INSERT ... ON CONFLICT DO UPDATE ... RETURNING bumping one UNLOGGED row of the loop's key: the floor of any counter kept in PostgreSQL, with no logic",
			New: func(w int) (Op, error) {
				key := "bench-" + s.run + "-" + strconv.Itoa(w)
				return func(ctx context.Context) error { return upsertCounter(ctx, s.Pool, key) }, nil
			}},
		{Name: NameUpsertTx, Kind: Baseline, What: "BEGIN + INSERT ... ON CONFLICT DO UPDATE ... RETURNING bumping one LOGGED row of the loop's key + COMMIT: the floor of a charge that commits with the caller's write",
			New: func(w int) (Op, error) {
				key := "bench-" + s.run + "-" + strconv.Itoa(w)
				return func(ctx context.Context) error { return upsertLoggedCounter(ctx, s.Pool, key) }, nil
			}},
		{Name: NameSemaphore, Kind: Baseline, What: "golang.org/x/sync/semaphore Acquire(1) + Release(1): one replica's in-memory cap",
			New: func(int) (Op, error) {
				return func(ctx context.Context) error {
					if err := s.sem.Acquire(ctx, 1); err != nil {
						return err
					}
					s.sem.Release(1)
					return nil
				}, nil
			}},
	}
	if s.redis != nil {
		ps = append(ps, Path{Name: NameRedisRate, Kind: Baseline, What: "github.com/go-redis/redis_rate/v10 Limiter.Allow on 127.0.0.1:6379 (one EVALSHA of its GCRA script)",
			New: func(w int) (Op, error) { return s.redis(w), nil }})
	}
	return ps
}

// failuresPerKey is how many failures the failure path records under one
// key before it moves to the next, below the cap (pglimit.MaxLimit) so
// that none is refused: a key's first failure inserts its row, the others
// update it, as a real key's do.
const failuresPerKey = 1000

// Limits are pglimit's limit paths, each through its package's public API.
func (s *Suite) Limits() []Path {
	user := func(w int) string { return "bench-" + s.run + "-" + strconv.Itoa(w) }
	return []Path{
		{Name: "heavy claim+release", Kind: Limit, What: "heavy.Limiter.Acquire (user and installation permit, one round trip) + Permit.Release (one statement)",
			New: func(w int) (Op, error) {
				u := user(w)
				return func(ctx context.Context) error {
					p, err := s.heavy.Acquire(ctx, u)
					if err != nil {
						return err
					}
					return p.Release(ctx)
				}, nil
			}},
		{Name: "sign-in check", Kind: Limit, What: "signin.Limiter.Acquire in lenient mode (one read of login_attempt) + Permit.Release (nothing written)",
			New: func(w int) (Op, error) {
				key := "username:" + user(w)
				return func(ctx context.Context) error {
					p, err := s.signin.Acquire(ctx, key)
					if err != nil {
						return err
					}
					return p.Release(ctx)
				}, nil
			}},
		{Name: NameStrictFailure, Kind: Limit, What: "a failed sign-in in strict mode (the default): signin.Limiter.Acquire (the reservation, one upsert) + Permit.Fail (nothing more written)",
			New: func(w int) (Op, error) {
				n := 0
				return func(ctx context.Context) error {
					key := "username:strict-fail-" + user(w) + "-" + strconv.Itoa(n/failuresPerKey)
					n++
					p, err := s.strict.Acquire(ctx, key)
					if err != nil {
						return err
					}
					return p.Fail(ctx)
				}, nil
			}},
		{Name: NameStrictSuccess, Kind: Limit, What: "a successful sign-in in strict mode: signin.Limiter.Acquire (the reservation, one upsert) + Permit.Succeed (the clear, one delete)",
			New: func(w int) (Op, error) {
				key := "username:strict-ok-" + user(w)
				return func(ctx context.Context) error {
					p, err := s.strict.Acquire(ctx, key)
					if err != nil {
						return err
					}
					return p.Succeed(ctx)
				}, nil
			}},
		{Name: "failure record", Kind: Limit, What: "a failed sign-in in lenient mode: signin.Limiter.Acquire + Permit.Fail (a read, then an upsert in its own transaction)",
			New: func(w int) (Op, error) {
				n := 0
				return func(ctx context.Context) error {
					key := "username:fail-" + user(w) + "-" + strconv.Itoa(n/failuresPerKey)
					n++
					p, err := s.failure.Acquire(ctx, key)
					if err != nil {
						return err
					}
					return p.Fail(ctx)
				}, nil
			}},
		{Name: "upload claim", Kind: Limit, What: "upload.Limiter.Acquire of a user's first slot in the window (kept, as a successful upload keeps it)",
			New: func(w int) (Op, error) {
				return func(ctx context.Context) error {
					_, err := s.upload.Acquire(ctx, user(w)+"-"+strconv.FormatInt(s.uploads.Add(1), 10))
					return err
				}, nil
			}},
		{Name: "in-flight claim+release", Kind: Limit, What: "inflight.Limiter.Acquire + Permit.Release of one token's slot",
			New: func(w int) (Op, error) {
				key := user(w)
				return func(ctx context.Context) error {
					p, err := s.flight.Acquire(ctx, key)
					if err != nil {
						return err
					}
					return p.Release(ctx)
				}, nil
			}},
		{Name: NameRateLimit, Kind: Limit, What: "ratelimit.Limiter.Acquire of the loop's key under one policy: one INSERT ... ON CONFLICT DO UPDATE ... RETURNING (APIRequestWindowDecideOne), remaining and reset derived",
			New: func(w int) (Op, error) {
				keys, i := rateKeys("one-"+user(w)), 0
				return func(ctx context.Context) error {
					i++
					_, err := s.rate.Acquire(ctx, keys[i%RateKeys])
					return err
				}, nil
			}},
		{Name: NameRateLimit2, Kind: Limit, What: "ratelimit.Limiter.AcquireN of the loop's key under two policies, all or nothing: one statement (APIRequestWindowDecide)",
			New: func(w int) (Op, error) {
				keys, i := rateKeys("two-"+user(w)), 0
				return func(ctx context.Context) error {
					i++
					_, err := s.rate.AcquireN(ctx, keys[i%RateKeys], 1, RatePolicies)
					return err
				}, nil
			}},
		{Name: NameBorrowed, Kind: Limit, What: "ratelimit.Limiter.Acquire of the loop's hot key with Options.Borrow: a unit spent from the batch this replica borrowed (one statement per batch, about half a second of a 1,000,000/s policy)",
			New: func(w int) (Op, error) {
				key := "borrow-" + user(w)
				return func(ctx context.Context) error {
					_, err := s.borrow.Acquire(ctx, key)
					return err
				}, nil
			}},
		{Name: NameFromMemory, Kind: Limit, What: "ratelimit.Limiter.Acquire of the loop's key refused for the hour: answered from memory (no statement) while the invalidation bus is live",
			New: func(w int) (Op, error) {
				key := "refuse-" + user(w)
				// The key's one unit, then its first refusal (the
				// database's, remembered).
				_, _ = s.refuse.Acquire(context.Background(), key)
				_, _ = s.refuse.Acquire(context.Background(), key)
				return func(ctx context.Context) error {
					_, err := s.refuse.Acquire(ctx, key)
					if errors.Is(err, vocab.ErrLimited) {
						return nil
					}
					if err == nil {
						return errors.New("bench: a key refused for the hour was admitted")
					}
					return err
				}, nil
			}},
		{Name: NameQuota, Kind: Limit, What: "quota.Limiter.AcquireN of the loop's key, monthly, UNLOGGED: one INSERT ... ON CONFLICT DO UPDATE ... RETURNING (QuotaUsageCharge), the period computed on the database clock",
			New: func(w int) (Op, error) {
				key := user(w)
				return func(ctx context.Context) error {
					_, err := s.quota.AcquireN(ctx, key, 1)
					return err
				}, nil
			}},
		{Name: NameQuotaSettle, Kind: Limit, What: "quota.Limiter.AcquireN of an estimate + Permit.Settle of the actual cost (one UPDATE by primary key)",
			New: func(w int) (Op, error) {
				key := user(w)
				return func(ctx context.Context) error {
					p, err := s.quota.AcquireN(ctx, key, 1)
					if err != nil {
						return err
					}
					return p.Settle(ctx, 3)
				}, nil
			}},
		{Name: NameQuotaTx, Kind: Limit, What: "BEGIN + quota.Limiter.ChargeTx on the LOGGED pglimit.quota_ledger + COMMIT: the charge that commits with the caller's write",
			New: func(w int) (Op, error) {
				key := user(w)
				return func(ctx context.Context) error {
					tx, err := s.Pool.Begin(ctx)
					if err != nil {
						return err
					}
					defer tx.Rollback(ctx) //nolint:errcheck // after Commit, a no-op
					if _, err := s.ledger.ChargeTx(ctx, tx, key, 1); err != nil {
						return err
					}
					return tx.Commit(ctx)
				}, nil
			}},
		{Name: NameAccessMatch, Kind: Limit, What: "access.Rules.Match over 10,000 rules (4,000 IPv4 and 4,000 IPv6 prefixes, nested, and 2,000 keys): in turn an IPv4 hit and miss, an IPv6 hit and miss, and two keys; no statement",
			New: func(int) (Op, error) {
				i := 0
				return func(context.Context) error {
					q := accessQueries[i%len(accessQueries)]
					i++
					if got := s.access.Match(q.addr, q.keys...); got != q.want {
						return fmt.Errorf("bench: Match(%v, %q) = %v, want %v", q.addr, q.keys, got, q.want)
					}
					return nil
				}, nil
			}},
		{Name: NameClientAddr, Kind: Limit, What: "clientaddr.Resolver.Key of a request from a trusted proxy (10.0.0.0/8) carrying X-Forwarded-For with two hops, in turn IPv4 and IPv6 (grouped by its /64): no statement",
			New: func(int) (Op, error) {
				r, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"10.0.0.0/8"}})
				if err != nil {
					return nil, err
				}
				headers := []http.Header{
					{"X-Forwarded-For": {"198.51.100.7, 10.1.2.3"}},
					{"X-Forwarded-For": {"[2001:db8:1:2::7]:443, 10.1.2.3"}},
				}
				want := []string{"198.51.100.7", "2001:db8:1:2::/64"}
				i := 0
				return func(context.Context) error {
					k, err := r.Key("10.9.8.7:5555", headers[i%2])
					if err != nil || k != want[i%2] {
						return fmt.Errorf("bench: clientaddr.Key = %q, want %q", k, want[i%2])
					}
					i++
					return nil
				}, nil
			}},
		{Name: NameBanned, Kind: Limit, What: "ratelimit.Limiter.Acquire of the loop's key, banned for the hour (ratelimit.Options.Ban, ban.Bans.Banned): answered from memory before the rate is looked at, whether or not the bus is live",
			New: func(w int) (Op, error) {
				key := "ban-" + user(w)
				// The key's one unit, then its first refusal, which bans it.
				_, _ = s.banned.Acquire(context.Background(), key)
				_, err := s.banned.Acquire(context.Background(), key)
				var le *ratelimit.LimitError
				if !errors.As(err, &le) || !le.Banned {
					return nil, fmt.Errorf("bench: the key's first refusal did not ban it: %v", err)
				}
				return func(ctx context.Context) error {
					_, err := s.banned.Acquire(ctx, key)
					if errors.As(err, &le) && le.Banned {
						return nil
					}
					if err == nil {
						return errors.New("bench: a banned key was admitted")
					}
					return err
				}, nil
			}},
		{Name: NameNode, Kind: Limit, What: "nodelimit Node.Wait with rate.Inf: the limiter's own cost per call to an upstream node (no database)",
			New: func(int) (Op, error) {
				return func(ctx context.Context) error { return s.node.Wait(ctx) }, nil
			}},
	}
}

func rateKeys(prefix string) []string {
	keys := make([]string, RateKeys)
	for i := range keys {
		keys[i] = prefix + "-" + strconv.Itoa(i)
	}
	return keys
}

// Pages are a 50-row page at each depth that fits in the fixture, by keyset
// (the cursor decoded and the next one signed, as a handler does) and by
// OFFSET. Each path checks the first row of its page against the other's.
func (s *Suite) Pages(ctx context.Context) ([]Path, error) {
	if s.Rows == 0 {
		return nil, nil
	}
	var ps []Path
	for _, depth := range Depths {
		if depth+PageSize > s.Rows {
			continue
		}
		var after string
		if depth > 0 {
			prev, err := readPage(ctx, s.Pool, offsetPageSQL, 1, depth-1)
			if err != nil || len(prev) != 1 {
				return nil, fmt.Errorf("depth %d: %v", depth, err)
			}
			after = s.pager.Next("bench", cursor.Page{Size: 1}, 1, cursor.Position{At: prev[0].at, ID: prev[0].id})
		}
		first, err := readPage(ctx, s.Pool, offsetPageSQL, 1, depth)
		if err != nil || len(first) != 1 {
			return nil, fmt.Errorf("depth %d: %v", depth, err)
		}
		want := first[0].id
		q := url.Values{"size": {strconv.Itoa(PageSize)}}
		if after != "" {
			q.Set("after", after)
		}
		ps = append(ps,
			Path{Name: PageName("keyset", depth), Kind: Page, Slow: depth >= 1_000_000,
				What: "cursor.Pager.Parse, a keyset page query, Pager.Next",
				New: func(int) (Op, error) {
					return func(ctx context.Context) error {
						page, err := s.pager.Parse(q, "bench")
						if err != nil {
							return err
						}
						var got []eventRow
						if page.After != nil {
							got, err = readPage(ctx, s.Pool, keysetPageSQL, page.After.At, page.After.ID, page.Size)
						} else {
							got, err = readPage(ctx, s.Pool, firstPageSQL, page.Size)
						}
						if err != nil {
							return err
						}
						if len(got) != PageSize || got[0].id != want {
							return fmt.Errorf("keyset page at %d: %d rows", depth, len(got))
						}
						last := got[len(got)-1]
						if s.pager.Next("bench", page, len(got), cursor.Position{At: last.at, ID: last.id}) == "" {
							return errors.New("no next cursor")
						}
						return nil
					}, nil
				}},
			Path{Name: PageName("OFFSET", depth), Kind: Page, Slow: depth >= 100_000,
				What: "LIMIT 50 OFFSET depth",
				New: func(int) (Op, error) {
					return func(ctx context.Context) error {
						got, err := readPage(ctx, s.Pool, offsetPageSQL, PageSize, depth)
						if err != nil {
							return err
						}
						if len(got) != PageSize || got[0].id != want {
							return fmt.Errorf("offset page at %d: %d rows", depth, len(got))
						}
						return nil
					}, nil
				}},
		)
	}
	return ps, nil
}

// PageName is the name of the page path of kind ("keyset" or "OFFSET") at
// depth, e.g. "keyset page @100k".
func PageName(kind string, depth int) string { return kind + " page @" + depthName(depth) }

func depthName(d int) string {
	switch {
	case d == 0:
		return "0"
	case d%1_000_000 == 0:
		return strconv.Itoa(d/1_000_000) + "M"
	case d%10_000 == 0 && d >= 1_000_000:
		return strconv.FormatFloat(float64(d)/1_000_000, 'f', 2, 64) + "M"
	case d%1_000 == 0:
		return strconv.Itoa(d/1_000) + "k"
	}
	return strconv.Itoa(d)
}

// accessQueries are the access path's requests, in turn.
var accessQueries = []struct {
	addr netip.Addr
	keys []string
	want access.List
}{
	{netip.MustParseAddr("10.0.7.200"), nil, access.Deny},
	{netip.MustParseAddr("192.0.2.1"), nil, access.None},
	{netip.MustParseAddr("2001:db8:0:7:abcd::9"), nil, access.Deny},
	{netip.MustParseAddr("2001:db9::1"), nil, access.None},
	{netip.MustParseAddr("192.0.2.1"), []string{"token:7", "user:bench-rule-6"}, access.Allow},
}

// accessRules writes the access path's 10,000 rules (in place of any
// written by an earlier run) and loads them.
func accessRules(ctx context.Context, pool *pgxpool.Pool) (*access.Rules, error) {
	// SQL in Go: a fixture of 10,000 rules written in one statement each
	// family (access.Rules.Add writes one rule per transaction).
	if _, err := pool.Exec(ctx, `
		DELETE FROM pglimit.access_rule WHERE match LIKE 'user:bench-rule-%' OR match LIKE '10.0.%' OR match LIKE '172.%.0.0/16'
		                                   OR match LIKE '2001:db8:%';
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END,
		       CASE i % 3
		           WHEN 0 THEN format('10.%s.%s.%s', i / 65536 % 256, i / 256 % 256, i % 256)
		           WHEN 1 THEN format('10.%s.%s.0/24', i / 256 % 256, i % 256)
		           ELSE format('172.%s.0.0/16', 16 + i % 16)
		       END
		FROM generate_series(0, 3999) AS i;
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END,
		       CASE i % 3
		           WHEN 0 THEN format('2001:db8:%s:%s::1', to_hex(i / 4096), to_hex(i % 4096))
		           WHEN 1 THEN format('2001:db8:%s:%s::/64', to_hex(i / 4096), to_hex(i % 4096))
		           ELSE format('2001:db8:%s::/48', to_hex(i))
		       END
		FROM generate_series(0, 3999) AS i;
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END, format('user:bench-rule-%s', i)
		FROM generate_series(0, 1999) AS i;`); err != nil {
		return nil, fmt.Errorf("bench: access rules: %w", err)
	}
	return access.New(ctx, pool, access.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
}
