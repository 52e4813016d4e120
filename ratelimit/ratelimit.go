// Package ratelimit limits the rate of requests per key — an API token, a
// user, a tenant — across every replica of a service, counted in
// PostgreSQL, the database the service already has. It is the engine,
// without net/http: it decides and returns what it decided as a value (a
// Permit, or a *LimitError with the policies' state and Retry-After).
// middleware/ratelimit is its HTTP face (the key and policies taken from a
// request, the RateLimit headers, the problem answers), and the gRPC front
// (module github.com/pglimit/pglimit/grpc) its interceptors.
//
// Each key is held to one or more Policies: Limit units per Window with
// bursts of up to Burst units, by GCRA (the generic cell rate algorithm,
// as go-redis/redis_rate has it): in any interval of length L at most
// Burst + Limit × L / Window units are admitted. A decision is one
// statement on the UNLOGGED table pglimit.api_request_window — an INSERT
// ... ON CONFLICT DO UPDATE ... RETURNING on the key's row, which holds
// the state of all its policies — so replicas deciding for one key at
// once take turns on that row's lock, and each judges what the one before
// it left. Every policy of a request is judged in that same statement: a
// request is admitted only if all of them have room, and a refused request
// spends none of them. Times come from the database clock. Read the
// statements in sql/queries/api_request_window.sql.
//
// A request costs one unit (Acquire), or what AcquireN is told (a bulk
// call may cost more), under Options.Policies or the policies AcquireN is
// given (by the caller's plan or tenant, so limits change without a
// restart). A refusal's RetryAfter is exact to the microsecond on the
// database clock, computed from the same statement's state.
//
// # Charged after the fact
//
// When a request's cost is known only once it is served (rows exported,
// tokens generated), AcquireN reserves an estimate before the work and
// Permit.Settle charges the difference after it: a further charge, made
// whatever the room (the work is done), or a refund, given back while no
// other decision has spent on the key since (else its units lapse on
// their own). The bound: in any interval of length L a key's actual units
// stay within Burst + Limit × L / Window plus, over its permits admitted
// and not yet settled, what each settles above its estimate
// (TestSettleBound holds replicas to it).
//
// # Refusals from memory
//
// Under GCRA a key's state only moves later until an operator resets it:
// other replicas can spend more, never less. So a refusal holds, exactly,
// for every request of that key of the same cost or more under the same
// policies until the time the statement named, and while pglimit.Run
// listens for invalidations (LISTEN pglimit) a replica answers those
// requests from memory with no statement: the same 429, headers and
// Retry-After, judged at the database's time (mapped from the replica's
// clock through the statement that refused, never later than the
// database's). A cheaper request, or one under other policies, is decided
// in the database; while a key is refused a replica's statements for it
// take turns, so a key hammered past its rate costs each replica one
// statement per refusal period besides the admitted ones. Reset clears a
// key everywhere within about a second. The table is bounded: at most
// 10,000 keys per Limiter (under 600 bytes each with one policy, about
// 6 MB); when it is full and nothing in it has lapsed, a new refusal is
// not remembered. Such refusals are counted in pglimit.decisions with the
// attribute source "memory". Dry run never answers from memory.
//
// # Borrowing
//
// With Options.Borrow, a key this replica decides ten times a second or
// more takes its policy's units in batches: one statement
// (APIRequestWindowBorrow) spends, in the database, about a second of the
// policy's units but at most a share of what the key has free (half while
// at least half is free, a quarter down to a fifth, a tenth below), and
// the replica spends them in memory. A batch is a stretch of the GCRA's
// own time line, and a unit of it is spent only while the database clock
// has not passed it, so every replica's admissions together stay within
// Burst + Limit × L / Window in every interval of length L, as without
// borrowing (the tests hold three replicas to that bound). The price is
// units one replica holds that another could have used: a request of
// another replica may be refused that would have fit. A batch unused for
// 250 ms, and every batch at Flush, is given back when no other decision
// spent after it; otherwise its units lapse. A replica that is killed
// strands at most its batches — per key at most half the burst — until
// they lapse, within Burst × Window / Limit. The metrics
// pglimit.ratelimit.borrowed, .spent, .returned and .stranded count units
// (attribute limit); a unit spent from memory is a decision of
// pglimit.decisions with source "memory". Keys decided less often, keys
// under several policies and dry run decide in the database per request.
//
// # Shares
//
// With Options.Shares (8 by default), a twentieth of each policy's burst
// and rate is kept apart, split into that many shares, and the database
// decides the rest. A replica holds at most one share (a lease in
// pglimit.share, renewed in the background while decisions come) and
// spends each key's share of it in memory, with no statement: a key that
// sends a replica less than its share's rate — a user who sends a request
// every few seconds, spread by a balancer — costs the database nothing
// per request. At most Shares replicas spend shares at once; a new holder
// spends nothing for a lease after its claim, each key's share empty then,
// so that no share is spent twice across a takeover, a holder that was
// killed or a restart of the database; and every replica's admissions
// together stay within Burst + Limit × L / Window in every interval of
// length L (TestSharesHoldTheRate, TestShareTakenAfterTheTableEmptied).
// The price: the database alone admits a twentieth less, so a client above
// 95 % of its limit on one replica may be refused a request one shared
// counter would have admitted (none at or under 90 % is), and one request
// may cost at most what the database decides at once. A policy whose
// burst is below 20 × Shares has none. A decision from a share reports the
// policy's state as if the key had spent only this request (this replica
// does not know what the others spent), counted in pglimit.decisions with
// source "memory".
//
// # Bans
//
// With Options.Ban, every refusal by the rate (not one of a request that
// can never pass) is counted toward its key's ban (package ban, under
// Options.QualifiedKey's key), and a key refused Rule.After times within
// Rule.Within is banned for Rule.For on every replica: refused before any
// statement, from memory, with a *LimitError whose Banned is true (429
// banned with Retry-After and retryAfter), counted in pglimit.decisions
// with outcome "banned" and source "memory". The refusal that bans is
// answered as banned already. Dry run neither counts nor refuses.
//
// # Failures
//
// When the database cannot be reached or does not answer within Timeout,
// AcquireN returns the error (pglimit.Classify tells which); a transport
// fails closed by default (503 database-unavailable, gRPC Unavailable) or,
// with Options.FailOpen, lets the request through uncounted. Either way the incident is logged once when it begins and once when the
// database answers again (with how many requests it touched), and counted
// once in the metric pglimit.ratelimit.incidents; every failed decision is
// counted in pglimit.decisions with outcome "error".
//
// A Limiter is safe for concurrent use.
package ratelimit

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/citus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/keys"
	"github.com/pglimit/pglimit/internal/memo"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/internal/vocab"
	"github.com/pglimit/pglimit/override"
)

// Defaults of Options.
const (
	defaultName    = "api"
	defaultTimeout = 5 * time.Second
)

// Options configure a Limiter. Every field has a default; a Limiter
// without Policies decides only what AcquireN names policies for.
type Options struct {
	// Name is the limiter's name: its rows in api_request_window, the
	// attribute "limit" of its metrics, its log lines. Limiters with
	// different names count apart. 1 to 64 letters, digits, '.', '_' or
	// '-'. Default "api".
	Name string
	// Policies are the policies of every request (Acquire, and AcquireN
	// given none), checked here. Default none: then every AcquireN names
	// its own (middleware/ratelimit's PolicyFunc).
	Policies []Policy
	// FailOpen lets requests through, uncounted, while the database cannot
	// be reached or does not answer within Timeout: AcquireN then returns
	// a Permit that spent nothing and has no Policies (the transports send
	// no RateLimit headers for it); the incidents are counted with the
	// attribute fail "open". Default false: AcquireN returns the
	// database's error, and such requests are refused (503
	// database-unavailable, gRPC Unavailable). Closed is the default because the limit
	// exists to protect the service when it is loaded, and a database
	// that stops answering in time is most often a loaded one: letting
	// every request through then adds to the load the limit was set to
	// shed, and the handlers behind it share that database anyway. Set it
	// for handlers that work without the database, where an outage of the
	// counter should not become an outage of the API.
	FailOpen bool
	// DryRun decides, counts, logs and sends headers as usual, but refuses
	// nobody: a request that would have been refused passes, spends
	// nothing, is counted with outcome "dry-run-refused" and logged (at
	// most a line a second, with the number of lines left out). How an
	// operator introduces a limit safely. Default false.
	DryRun bool
	// Timeout bounds the database work of one decision when the caller's
	// context has no sooner deadline. Default 5s.
	Timeout time.Duration
	// Borrow lets a replica take a key it decides often (ten times a
	// second or more) in batches: one statement spends up to about a
	// second of the policy's units, at most a share of what the key has
	// free, and the replica spends them in memory (see Borrowing). It
	// never admits past the policy's bound; the units a replica holds may
	// refuse another replica's request that would have fit. Keys judged by
	// several policies, and dry run, decide in the database per request.
	// Default false: every admission is a statement.
	Borrow bool
	// Shares is how many replicas may spend a key's share of each policy
	// in memory, with no statement (see Shares): a twentieth of each
	// policy's burst and rate, split into Shares shares, spent by at most
	// Shares replicas at once; the database decides the rest. A key that
	// sends a replica less than its share's rate — a user who sends a
	// request every few seconds — costs no statement. Exact: every
	// replica's admissions together stay within the policy's bound. The
	// price: the database admits a twentieth less, so a client above 95 %
	// of its limit may be refused a request one shared counter would have
	// admitted, and one request may cost at most Burst less the shares'
	// units. Every replica of a limiter must have the same Shares. A policy
	// whose burst is below 20 × Shares has no shares. -1 turns them off.
	// Default 8.
	Shares int
	// Ban, when set, bans keys this limiter refuses too often (package
	// ban): every refusal of a key is counted toward its ban, and a
	// banned key is refused before any statement, from memory, with a
	// *LimitError whose Banned is true (429 banned), until its ban ends or
	// an operator lifts it. Dry run neither counts nor refuses. Default
	// nil: no bans.
	Ban *ban.Bans
	// Overrides, when set, give keys their own limit under a policy (a
	// customer's plan, changed while the service runs: package override;
	// the Store's Run must run for other replicas' changes to reach it):
	// a key with an override in force under a policy's Name is judged
	// with that Limit, and its Burst scaled by the same ratio (rounded up,
	// at least 1); an override of 0 refuses every request of the key,
	// without Retry-After, and one above 1,000,000 is 1,000,000. What the
	// key spent before stays spent as the same share of its burst (the
	// GCRA keeps time, not a count): a raised limit refills faster and
	// admits the larger burst once the key is quiet, it does not forgive
	// at once. Read from memory: no statement. A borrowed batch of a key
	// whose limit changed is given back at the key's next request
	// (TestOverrideAcrossReplicas, TestOverrideGivesBackBorrowedBatch).
	// Default nil: none.
	Overrides *override.Store
	// QualifiedKey gives the name of the limiter's key outside the
	// limiter: what a refusal is counted and a ban kept under, and what an
	// override is looked up under (so that several limiters and key kinds
	// share one Bans and one override.Store without meeting:
	// "address:" + key). Default: the key.
	QualifiedKey func(key string) string
	// Logger receives the incident and dry-run lines. Default
	// slog.Default() (taken at New).
	Logger *slog.Logger
	// MeterProvider gives the meter of the metrics pglimit.decisions,
	// pglimit.decision.duration and pglimit.ratelimit.incidents. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Limiter limits the rate of requests per key. It is safe for concurrent
// use.
type Limiter struct {
	pool      *pgxpool.Pool
	q         *db.Queries
	name      string
	policies  []Policy
	failOpen  bool
	timeout   time.Duration
	log       *slog.Logger
	obs       *observe.Limit
	incidents metric.Int64Counter
	incident  incidents
	errLog    observe.Sampled
	// memory answers refusals that hold until a known time; borrow is
	// nil unless Options.Borrow.
	sub    *bus.Subscription
	memory *memo.Table[*refusal]
	borrow *borrower
	// shares is nil unless Options.Shares (see Shares).
	shares *shares
	// bans is Options.Ban (nil: none), over Options.Overrides, qualify
	// Options.QualifiedKey.
	bans    *ban.Bans
	over    *override.Store
	qualify func(string) string
	// generalOnly makes every decision use APIRequestWindowDecide (tests
	// compare the two statements).
	generalOnly bool
	// citus tells whether decisions run on a Citus key's shard
	// (APIRequestWindowDecideOnShard, APIRequestWindowBorrowOnShard).
	citus citus.Detector
}

// New returns a Limiter counting in pool's database, which must have
// pglimit's schema. It checks opts once, here.
func New(pool *pgxpool.Pool, opts Options) (*Limiter, error) {
	if pool == nil {
		return nil, errors.New("ratelimit: nil pool")
	}
	if opts.Name == "" {
		opts.Name = defaultName
	}
	if err := validName(opts.Name); err != nil {
		return nil, fmt.Errorf("ratelimit: Options.Name: %v", err)
	}
	if len(opts.Policies) > 0 {
		if err := checkPolicies(opts.Policies); err != nil {
			return nil, err
		}
	}
	if err := vocab.OrDefault("ratelimit", "Timeout", &opts.Timeout, defaultTimeout); err != nil {
		return nil, err
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.MeterProvider == nil {
		opts.MeterProvider = otel.GetMeterProvider()
	}
	obs, err := observe.New(observe.Options{Name: opts.Name, Scopes: []string{scopeKey}, DryRun: opts.DryRun,
		MeterProvider: opts.MeterProvider, Logger: opts.Logger, DB: pool, Timeout: opts.Timeout})
	if err != nil {
		return nil, fmt.Errorf("ratelimit: %w", err)
	}
	incidents, err := newIncidentCounter(opts.MeterProvider)
	if err != nil {
		return nil, err
	}
	l := &Limiter{
		pool: pool, q: db.New(), name: opts.Name,
		policies: slices.Clone(opts.Policies),
		failOpen: opts.FailOpen, timeout: opts.Timeout,
		log: opts.Logger, obs: obs, incidents: incidents,
		bans: opts.Ban, over: opts.Overrides, qualify: opts.QualifiedKey,
	}
	if l.qualify == nil {
		l.qualify = func(k string) string { return k }
	}
	l.incident.init(l)
	b := bus.For(pool)
	l.sub = b.Subscribe(bus.TopicRate+l.name, l.forget, l.forgetAll)
	l.memory = memo.New[*refusal](b, l.sub)
	switch {
	case opts.Shares < -1 || opts.Shares > 1024:
		return nil, fmt.Errorf("ratelimit: Options.Shares %d: want -1 (off) to 1024", opts.Shares)
	case opts.Shares == 0:
		opts.Shares = defaultShares
	}
	if opts.Shares > 0 {
		l.shares = newShares(l, opts.Shares)
	}
	if opts.Borrow && !opts.DryRun {
		if l.borrow, err = newBorrower(l, opts.MeterProvider); err != nil {
			return nil, err
		}
	}
	return l, nil
}

// Reset clears key's state on every replica: its row in
// api_request_window goes, and every replica forgets the refusals and
// borrowed units of the key it remembers, within about a second (the
// notification sent after the delete). The key's next request starts a
// full bucket. For an operator who lets a client in again.
func (l *Limiter) Reset(ctx context.Context, key string) error {
	if key == "" {
		return errors.New("ratelimit: empty key")
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	stored := keys.Stored(key)
	if err := l.q.APIRequestWindowReset(ctx, l.pool, &db.APIRequestWindowResetParams{Name: l.name, Key: stored}); err != nil {
		return fmt.Errorf("ratelimit: reset: %w", dberr.OwnTimeout(ctx, err))
	}
	if err := l.q.BusNotify(ctx, l.pool, bus.TopicRate+l.name+"\n"+stored); err != nil {
		return fmt.Errorf("ratelimit: reset: the replicas were not told: %w", dberr.OwnTimeout(ctx, err))
	}
	return nil
}

// KeyState is a key's state under a Limiter's policies, as Keys reads it.
type KeyState struct {
	// Key is the key as the table stores it: the key itself, or
	// "sha256:" and the hex of its digest when it is longer than 200
	// bytes or not valid UTF-8.
	Key string
	// Policies are the key's state under each of Options.Policies (its
	// override's limit where it has one) that the key has spent in.
	Policies []PolicyState
}

// maxKeys bounds one page of Keys.
const maxKeys = 1000

// Keys lists the keys whose state still counts (they spent within their
// policies' tolerance), in key order after the key after ("" for the
// first page), at most max (1 to 1,000), each with its remaining and
// reset under Options.Policies, read in one statement and consuming
// nothing. Units a replica borrowed and has not spent count as spent. A
// Limiter with PolicyFunc and no Options.Policies has no policies to judge
// a key by: Keys returns an error matching ErrInvalidPolicy.
func (l *Limiter) Keys(ctx context.Context, after string, max int) ([]KeyState, error) {
	if max < 1 || max > maxKeys {
		return nil, fmt.Errorf("ratelimit: keys: max %d is not between 1 and %d", max, maxKeys)
	}
	if len(l.policies) == 0 {
		return nil, policyError("Keys judges keys by Options.Policies, which is empty")
	}
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	rows, err := l.q.APIRequestWindowKeys(ctx, l.pool, &db.APIRequestWindowKeysParams{Name: l.name, After: after, Max: int32(max)})
	if err != nil {
		return nil, fmt.Errorf("ratelimit: keys: %w", dberr.OwnTimeout(ctx, err))
	}
	out := make([]KeyState, 0, len(rows))
	for _, r := range rows {
		policies, _ := l.overridden(r.Key, l.policies)
		decided := l.decidedBy(policies)
		ks := KeyState{Key: r.Key}
		for j, p := range policies {
			if i := slices.Index(r.Policies, p.Name); i >= 0 && i < len(r.Tats) {
				st := stateOf(decided[j], r.Now.UnixMicro(), r.Tats[i].UnixMicro())
				st.Policy = p
				ks.Policies = append(ks.Policies, st)
			}
		}
		if len(ks.Policies) > 0 {
			out = append(out, ks)
		}
	}
	return out, nil
}

// Flush gives back the units this replica borrowed and has not spent
// (Options.Borrow), so other replicas may spend them: call it when the
// replica shuts down. Without borrowing it does nothing.
func (l *Limiter) Flush(ctx context.Context) error {
	if l.shares != nil {
		if err := l.shares.flush(ctx); err != nil {
			return fmt.Errorf("ratelimit: flush: giving the share back: %w", err)
		}
	}
	if l.borrow == nil {
		return nil
	}
	if err := l.borrow.flush(ctx); err != nil {
		return fmt.Errorf("ratelimit: flush: %w", err)
	}
	return nil
}

// Name returns Options.Name.
func (l *Limiter) Name() string { return l.name }

// Policies returns a copy of Options.Policies, the policies of a request
// AcquireN names none for.
func (l *Limiter) Policies() []Policy { return slices.Clone(l.policies) }

// Exempted counts a request a transport let through uncounted, spending
// nothing (an allow list's exemption): outcome "exempt" in
// pglimit.decisions.
func (l *Limiter) Exempted(ctx context.Context) { l.obs.Exempted(ctx, scopeKey) }
