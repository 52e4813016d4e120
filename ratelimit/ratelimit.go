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
	"math"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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
	// customer's plan, changed while the service runs: package override):
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

// forget drops what this replica remembers of a key (stored form): an
// operator reset it.
func (l *Limiter) forget(key string) {
	l.memory.Forget(key)
	if l.borrow != nil {
		l.borrow.drop(key)
	}
}

func (l *Limiter) forgetAll() {
	l.memory.ForgetAll()
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

// decidedBy is policies as the database decides them: with Options.Shares,
// each less the shares kept apart from it.
func (l *Limiter) decidedBy(policies []Policy) []Policy {
	if l.shares == nil {
		return policies
	}
	return l.shares.reduce(policies)
}

// asConfigured puts policies (the request's, as configured and
// overridden) back into the states and refusal of a decision made by the
// policies the database decided (decidedBy): the headers and the problem
// name the configured policy, and report the state the database holds.
func asConfigured(policies []Policy, states []PolicyState, e *LimitError) {
	for i := range states {
		if i < len(policies) && states[i].Name == policies[i].Name {
			states[i].Policy = policies[i]
		}
	}
	if e != nil {
		for i := range e.Policies {
			if i < len(policies) && e.Policies[i].Name == policies[i].Name {
				e.Policies[i].Policy = policies[i]
			}
		}
		if len(e.Violated) > 0 {
			e.Limit = limitOf(policies, e.Violated[0])
		}
	}
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

// PolicyState is one policy of a decision and the key's state in it.
type PolicyState struct {
	Policy
	// Remaining is the units the key may spend at once now (the header's
	// r): after the request when it was admitted, before it when refused.
	Remaining int
	// Reset is the time until one more unit is available (the header's t,
	// rounded up to whole seconds); 0 when the key has spent nothing.
	Reset time.Duration
}

// Permit is an admitted request: the decision, made at At on the
// database clock, and the state of each policy after it. Release is a
// no-op: a rate is spent when it is granted; Settle charges the
// difference when the request's actual cost is known only after it. A
// Permit is not safe for concurrent use.
type Permit struct {
	// Name is the limiter's name.
	Name string
	// Cost is the units the request spent (0 in dry run when Refusal is
	// not nil); after Settle, its actual cost.
	Cost int
	// Policies are the request's policies, in its order.
	Policies []PolicyState
	// At is when the decision was made, on the database clock.
	At time.Time

	refusal *LimitError
	// For Settle: the Limiter (nil for a dry-run refusal, which spent
	// nothing), the key as stored, the policies the request was judged
	// by (its overrides applied), the TATs the admission left (nil when it
	// was spent from a borrowed batch: borrowed), and whether it was
	// settled.
	l        *Limiter
	key      string
	policies []Policy
	tats     []time.Time
	borrowed bool
	settled  bool
}

// maxSettle bounds what a settle may move a policy's TAT, in
// microseconds: about 290,000 years, far inside PostgreSQL's interval
// and clear of int64 overflow.
const maxSettle = math.MaxInt64 / 1000

// Settle charges the difference between actual and the Cost the permit
// was admitted at, once the request's actual cost is known (rows exported,
// tokens generated, bytes stored): AcquireN reserves an estimate before
// the work, Settle corrects it after. A further charge, when the work cost
// more, is made whatever the room — the work is done — so the key is
// refused the longer; a refund, when it cost less, is given back while no
// other decision has spent on the key since this one (then every replica
// is told to forget the key's remembered refusals, which the refund may
// have undone), and otherwise its units lapse on their own, as they do
// for a permit spent from a borrowed batch (Options.Borrow), which never
// refunds. The bound: in any interval of length L a key's actual units
// stay within Burst + Limit × L / Window plus, over its permits admitted
// and not yet settled, what each settles above its estimate (with
// settles that never exceed their estimate, within the policy's bound).
// A second Settle returns pglimit.ErrSettled; a negative actual an error
// matching pglimit.ErrInvalidCost; a database that could not write it an error
// (pglimit.Classify), and the estimate stands. The settle outlives ctx's
// cancellation, bounded by Options.Timeout. A dry-run refusal's permit
// spent nothing and settles nothing.
func (p *Permit) Settle(ctx context.Context, actual int) error {
	if actual < 0 {
		return fmt.Errorf("ratelimit: %w: settle of %d", vocab.ErrInvalidCost, actual)
	}
	if p.settled {
		return vocab.ErrSettled
	}
	delta := actual - p.Cost
	for _, pol := range p.policies {
		if t := pol.emission(); int64(delta) > maxSettle/t || int64(delta) < -maxSettle/t {
			return fmt.Errorf("ratelimit: %w: settle of %d under policy %s", vocab.ErrInvalidCost, actual, pol.Name)
		}
	}
	p.settled = true
	if delta == 0 || p.l == nil || delta < 0 && p.borrowed {
		if p.l != nil {
			p.Cost = actual
		}
		return nil
	}
	if err := p.l.settle(ctx, p, delta); err != nil {
		p.settled = false
		return err
	}
	p.Cost = actual
	return nil
}

// settle runs APIRequestWindowSettle for p, delta units more (or, less
// than 0, fewer) than it was admitted at, and updates p's states.
func (l *Limiter) settle(ctx context.Context, p *Permit, delta int) error {
	ctx, cancel := dberr.WithTimeout(context.WithoutCancel(ctx), l.timeout)
	defer cancel()
	arg := &db.APIRequestWindowSettleParams{Name: l.name, Key: p.key, Tats: p.tats,
		Policies: make([]string, len(p.policies)), Deltas: make([]pgtype.Interval, len(p.policies))}
	for i, pol := range p.policies {
		arg.Policies[i] = pol.Name
		arg.Deltas[i] = micros(pol.emission() * int64(delta))
	}
	if arg.Tats == nil {
		arg.Tats = []time.Time{}
	}
	start := time.Now()
	row, err := l.q.APIRequestWindowSettle(ctx, l.pool, arg)
	l.obs.Took(ctx, observe.Record, start)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // a refund after another decision spent, or a row that lapsed
	}
	if err != nil {
		return fmt.Errorf("ratelimit: settle: %w", dberr.OwnTimeout(ctx, err))
	}
	if delta < 0 {
		// The same invalidation as Reset's, so that a refusal decided
		// before it is never remembered after it (memo's sequence): it
		// also drops the key's batches other replicas borrowed, whose
		// units then lapse (the safe direction; a refund comes from a
		// permit not spent from a batch, of a key cool on this replica).
		if err := l.q.BusNotify(ctx, l.pool, bus.TopicRate+l.name+"\n"+p.key); err != nil {
			l.errLog.Log(ctx, l.log, slog.LevelWarn, "ratelimit: the replicas were not told of a refund; they refuse the key from memory until their refusal lapses",
				"limit", l.name, "err", err)
		}
	}
	for i, pol := range p.policies {
		if j := slices.Index(row.Policies, pol.Name); j >= 0 && j < len(row.Tats) && i < len(p.Policies) {
			p.Policies[i] = stateOf(pol, row.DecidedAt.UnixMicro(), row.Tats[j].UnixMicro())
		}
	}
	return nil
}

// Refusal is, in dry run, the refusal the decision would have been
// without it (the request was let through and spent nothing); nil when
// the request fits.
func (p *Permit) Refusal() *LimitError { return p.refusal }

// Release does nothing and returns nil: a rate is spent when it is
// granted and never given back. It exists so that every pglimit permit
// is released the same way.
func (p *Permit) Release(context.Context) error { return nil }

// Acquire spends one unit of key's rate under Options.Policies, for
// callers that are not HTTP handlers. It returns a *LimitError when a
// policy has no room (in dry run: a Permit whose Refusal says so).
func (l *Limiter) Acquire(ctx context.Context, key string) (*Permit, error) {
	return l.AcquireN(ctx, key, 1, nil)
}

// AcquireN spends cost units of key's rate under policies (nil:
// Options.Policies), all or nothing. It returns a *LimitError (matching
// pglimit.ErrLimited) when a policy has no room for cost (in dry run: a Permit with Refusal set), an
// error matching ErrInvalidPolicy for policies that cannot be used, and a
// database error (pglimit.Classify tells which) when the decision could
// not be made — with Options.FailOpen, when the database cannot be
// reached or did not answer in time, a Permit that spent nothing and has
// no Policies instead (a caller that went away still gets the error).
func (l *Limiter) AcquireN(ctx context.Context, key string, cost int, policies []Policy) (*Permit, error) {
	p, err := l.acquireN(ctx, key, cost, policies)
	if err != nil && l.failOpen && isUnavailable(err) && !isCanceled(ctx, err) {
		return &Permit{Name: l.name, Cost: 0, At: time.Now()}, nil
	}
	return p, err
}

func (l *Limiter) acquireN(ctx context.Context, key string, cost int, policies []Policy) (*Permit, error) {
	if key == "" {
		return nil, errors.New("ratelimit: empty key")
	}
	if cost < 0 {
		return nil, fmt.Errorf("ratelimit: %w: %d", vocab.ErrInvalidCost, cost)
	}
	if policies == nil {
		policies = l.policies
	} else if err := checkPolicies(policies); err != nil {
		return nil, err
	}
	if len(policies) == 0 {
		return nil, policyError("no policies: Options.Policies is empty")
	}
	dryRun := l.obs.DryRun()
	if l.bans != nil && !dryRun {
		if until, banned := l.bans.Banned(ctx, l.qualify(key)); banned {
			l.obs.BannedFromMemory(ctx, scopeKey)
			return nil, &LimitError{Name: l.name, Banned: true, RetryAfter: max(time.Until(until), time.Microsecond), Cost: cost}
		}
	}
	policies, nothing := l.overridden(key, policies)
	if nothing != nil {
		return l.refused(ctx, key, &LimitError{Name: l.name, Violated: nothing, Limit: 0, Cost: cost})
	}
	// The database decides by decided: policies less their shares.
	decided := l.decidedBy(policies)
	if never := exceedsBurst(decided, cost); never != nil {
		return l.refused(ctx, key, &LimitError{Name: l.name, Violated: never, Limit: limitOf(policies, never[0]), Cost: cost})
	}
	stored := keys.Stored(key)
	now := time.Now()
	if l.shares != nil && l.shares.acquire(stored, cost, policies, now) {
		// From this replica's share of the key: no statement.
		l.obs.GrantedFromMemory(ctx, scopeKey)
		states := make([]PolicyState, len(policies))
		for i, p := range decided {
			states[i] = stateOf(p, now.UnixMicro(), now.UnixMicro()+int64(cost)*p.emission())
			states[i].Policy = policies[i]
		}
		return &Permit{Name: l.name, Cost: cost, Policies: states, At: now, l: l, key: stored, policies: decided, borrowed: true}, nil
	}
	if !dryRun {
		le, gate := l.recall(stored, cost, decided, now)
		if le == nil && gate != nil {
			// The key was refused lately: this replica's statements for it
			// take turns, and each looks again first, so that one asks
			// the database when the refusal lapses.
			gate.Lock()
			defer gate.Unlock()
			now = time.Now()
			le, _ = l.recall(stored, cost, decided, now)
		}
		if le != nil {
			l.obs.RefusedFromMemory(ctx, scopeKey)
			asConfigured(policies, le.Policies, le)
			return nil, l.toward(ctx, key, le)
		}
	}
	if l.borrow != nil && len(decided) == 1 && cost > 0 {
		p, err, done := l.borrow.acquire(ctx, stored, cost, decided[0], decided, now)
		if done {
			var le *LimitError
			if p != nil {
				asConfigured(policies, p.Policies, nil)
			} else if errors.As(err, &le) {
				asConfigured(policies, le.Policies, le)
			}
			return l.borrowed(ctx, key, p, err)
		}
	}
	seq := l.memory.Seq()
	start := time.Now()
	d, err := l.decide(ctx, stored, cost, decided)
	received := time.Now()
	l.obs.Took(ctx, observe.Check, start)
	if err != nil {
		if !isCanceled(ctx, err) {
			l.incident.failed(ctx, err)
		}
		l.obs.Failed(ctx, scopeKey, err)
		return nil, err
	}
	l.incident.recovered(ctx)
	if d.refusal != nil {
		if !dryRun {
			l.remember(stored, decided, cost, d, start, received, seq)
		}
		if l.shares != nil {
			// A refusal remembered keeps the policies it was decided by;
			// the one returned names the configured ones.
			e := *d.refusal
			e.Policies = slices.Clone(e.Policies)
			asConfigured(policies, e.Policies, &e)
			return l.refused(ctx, key, &e)
		}
		return l.refused(ctx, key, d.refusal)
	}
	l.obs.Granted(ctx, scopeKey)
	if l.shares != nil {
		asConfigured(policies, d.states, nil)
	}
	return &Permit{Name: l.name, Cost: cost, Policies: d.states, At: d.at, l: l, key: stored, policies: decided, tats: d.tats}, nil
}

// refusal is a refusal remembered (package memo): under GCRA a key's TATs
// only move later until an operator resets the key (other replicas can
// spend more, never less), so a refusal of a key, for a cost and a set of
// policies, holds for every request of that key of that cost or more under
// the same policies until the time the statement named.
type refusal struct {
	policies []Policy
	cost     int
	tats     []time.Time
	clock    clock
}

// clock maps this replica's clock to the database's, from one statement:
// at is its time on the database clock, sent and received when it was sent
// and answered on this replica's (monotonic) clock. The database read its
// clock between the two, so at + (t − sent) is at least the database's
// time at t and at + (t − received) at most.
type clock struct{ at, sent, received time.Time }

// above is the database's time at t, from above: what a borrowed unit is
// judged by, which must never be spent late, and what a remembered refusal
// is judged by and reports (its At and Retry-After): a refusal answered
// from memory holds at every time the database's clock can show, so it is
// never one the database would not have made for this request (judged
// from below it could be up to the statement's way back early: the load
// check on Citus counted such a refusal with room).
func (c clock) above(t time.Time) time.Time { return c.at.Add(t.Sub(c.sent)) }

// below is the database's time at t, from below: what a permit spent from
// a borrowed batch reports as its At.
func (c clock) below(t time.Time) time.Time { return c.at.Add(t.Sub(c.received)) }

// remember keeps a refusal d the database made for a statement sent at
// sent and answered at received, until received + its RetryAfter.
func (l *Limiter) remember(key string, policies []Policy, cost int, d *decision, sent, received time.Time, seq uint64) {
	l.memory.Remember(key, received.Add(d.refusal.RetryAfter),
		&refusal{policies: slices.Clone(policies), cost: cost, tats: d.tats, clock: clock{d.at, sent, received}}, seq)
}

// recall answers a request from a remembered refusal that still holds:
// judged again at the database's time now (from above, see clock) against
// the TATs it returned, which can only have moved later since. Nil when
// nothing remembered holds; gate is the key's gate while it has a refusal
// remembered (see memo.Linger).
func (l *Limiter) recall(key string, cost int, policies []Policy, now time.Time) (*LimitError, *sync.Mutex) {
	e, _, ok, gate := l.memory.Recall(key, now)
	if !ok || cost < e.cost || !slices.Equal(e.policies, policies) {
		return nil, gate
	}
	d, err := l.judge(policies, cost, false, e.clock.above(now), e.tats)
	if err != nil {
		return nil, gate // it no longer holds
	}
	return d.refusal, gate
}

// borrowed counts a decision borrowing made (a permit spent from memory or
// borrowed in a statement, a refusal, an error).
func (l *Limiter) borrowed(ctx context.Context, key string, p *Permit, err error) (*Permit, error) {
	var le *LimitError
	switch {
	case err == nil:
		l.incident.recovered(ctx)
		l.obs.GrantedFromMemory(ctx, scopeKey)
		return p, nil
	case errors.As(err, &le):
		l.incident.recovered(ctx)
		return l.refused(ctx, key, le)
	}
	if !isCanceled(ctx, err) {
		l.incident.failed(ctx, err)
	}
	l.obs.Failed(ctx, scopeKey, err)
	return nil, err
}

// refused counts and returns a refusal, or in dry run logs it and returns
// a Permit that carries it.
func (l *Limiter) refused(ctx context.Context, key string, e *LimitError) (*Permit, error) {
	l.obs.Refused(ctx, scopeKey, key, "violated", e.Violated, "cost", e.Cost, "retry_after", e.RetryAfter)
	if !l.obs.DryRun() {
		return nil, l.toward(ctx, key, e)
	}
	return &Permit{Name: l.name, Policies: e.Policies, At: e.At, refusal: e}, nil
}

// toward counts a refusal of key by the rate (not one of a request that
// can never pass) toward key's ban, with Options.Ban. When it bans the key
// the request is answered as banned; a count that fails is logged and the
// refusal stands.
func (l *Limiter) toward(ctx context.Context, key string, e *LimitError) error {
	if l.bans == nil || e.RetryAfter <= 0 || e.Banned {
		return e
	}
	until, banned, err := l.bans.Refused(ctx, l.qualify(key))
	if err != nil {
		l.errLog.Log(ctx, l.log, slog.LevelWarn, "ratelimit: a refusal was not counted toward its key's ban", "limit", l.name, "err", err)
		return e
	}
	if !banned {
		return e
	}
	return &LimitError{Name: l.name, Banned: true, RetryAfter: max(time.Until(until), time.Microsecond), Cost: e.Cost}
}

// overridden returns policies with the limits Options.Overrides gives key
// (policies itself when none applies), and the names of the policies
// whose override allows nothing.
func (l *Limiter) overridden(key string, policies []Policy) ([]Policy, []string) {
	if l.over == nil {
		return policies, nil
	}
	qualified := l.qualify(key)
	var out []Policy
	var nothing []string
	for i, p := range policies {
		n, ok := l.over.Limit(p.Name, qualified)
		if !ok || n == int64(p.Limit) {
			continue
		}
		if out == nil {
			out = slices.Clone(policies)
		}
		if n == 0 {
			nothing = append(nothing, p.Name)
			continue
		}
		out[i] = p.withLimit(int(min(n, maxUnits)))
	}
	if out == nil {
		return policies, nil
	}
	return out, nothing
}

// exceedsBurst names the policies whose Burst is below cost: a request of
// that cost can never pass them.
func exceedsBurst(ps []Policy, cost int) []string {
	var names []string
	for _, p := range ps {
		if cost > p.burst() {
			names = append(names, p.Name)
		}
	}
	return names
}

func limitOf(ps []Policy, name string) int {
	for _, p := range ps {
		if p.Name == name {
			return p.Limit
		}
	}
	return 0
}

// decision is what one statement decided, seen from Go.
type decision struct {
	at      time.Time
	states  []PolicyState
	tats    []time.Time
	refusal *LimitError
}

// decide runs the decision's statement: APIRequestWindowDecideOne for one
// policy (on Citus APIRequestWindowDecideOneOnShard), and
// APIRequestWindowDecide (on Citus the function pglimit.rate_decide) for
// several or when the key's row holds other policies too.
func (l *Limiter) decide(ctx context.Context, key string, cost int, policies []Policy) (*decision, error) {
	ctx, cancel := dberr.WithTimeout(ctx, l.timeout)
	defer cancel()
	d, err := l.decideOn(ctx, key, cost, policies)
	// A decision stopped by the limiter's own Timeout is a database that
	// did not answer in time (pglimit.ClassUnavailable).
	return d, dberr.OwnTimeout(ctx, err)
}

func (l *Limiter) decideOn(ctx context.Context, key string, cost int, policies []Policy) (*decision, error) {
	onShard, err := l.citus.On(ctx, l.pool)
	if err != nil {
		return nil, err
	}
	if len(policies) == 1 && !l.generalOnly {
		p := policies[0]
		arg := &db.APIRequestWindowDecideOneParams{
			Name: l.name, Key: key, Policy: p.Name,
			Increment: micros(p.emission() * int64(cost)), Tolerance: micros(p.emission() * int64(p.burst())),
		}
		var row *db.APIRequestWindowDecideOneRow
		if onShard {
			var r *db.APIRequestWindowDecideOneOnShardRow
			if r, err = l.q.APIRequestWindowDecideOneOnShard(ctx, l.pool, (*db.APIRequestWindowDecideOneOnShardParams)(arg)); err == nil {
				row = (*db.APIRequestWindowDecideOneRow)(r)
			}
		} else {
			row, err = l.q.APIRequestWindowDecideOne(ctx, l.pool, arg)
		}
		switch {
		case err == nil:
			return l.judge(policies, cost, row.Allowed, row.DecidedAt, []time.Time{row.Tat})
		case !errors.Is(err, pgx.ErrNoRows):
			return nil, err
		}
	}
	arg := &db.APIRequestWindowDecideParams{Name: l.name, Key: key,
		Policies:   make([]string, len(policies)),
		Increments: make([]pgtype.Interval, len(policies)),
		Tolerances: make([]pgtype.Interval, len(policies)),
	}
	for i, p := range policies {
		arg.Policies[i] = p.Name
		arg.Increments[i] = micros(p.emission() * int64(cost))
		arg.Tolerances[i] = micros(p.emission() * int64(p.burst()))
	}
	var row *db.APIRequestWindowDecideRow
	if onShard {
		r, err := l.q.APIRequestWindowDecideOnShard(ctx, l.pool, (*db.APIRequestWindowDecideOnShardParams)(arg))
		if err != nil {
			return nil, err
		}
		row = (*db.APIRequestWindowDecideRow)(r)
	} else if row, err = l.q.APIRequestWindowDecide(ctx, l.pool, arg); err != nil {
		return nil, err
	}
	tats := make([]time.Time, len(policies))
	for i, p := range policies {
		if j := slices.Index(row.Policies, p.Name); j >= 0 && j < len(row.Tats) {
			tats[i] = row.Tats[j]
		}
	}
	return l.judge(policies, cost, row.Allowed, row.DecidedAt, tats)
}

func micros(us int64) pgtype.Interval { return pgtype.Interval{Microseconds: us, Valid: true} }

// judge derives each policy's state from the TATs the statement returned
// (after the request when it was allowed, before it when refused; the
// zero time for a policy the key has no state in) and the time of the
// decision. For a refusal it names the policies without room and the
// time until the request fits: the longest of theirs.
func (l *Limiter) judge(policies []Policy, cost int, allowed bool, at time.Time, tats []time.Time) (*decision, error) {
	now := at.UnixMicro()
	// One allocation for the common case of one policy: the decision, its
	// state, and a refusal's error and violated name.
	var d *decision
	if len(policies) == 1 {
		one := &judgedOne{}
		one.d.states = one.states[:]
		one.d.refusal = &one.le
		one.le.Violated = one.violated[:0]
		d = &one.d
	} else {
		d = &decision{states: make([]PolicyState, len(policies)), refusal: &LimitError{}}
	}
	d.at, d.tats = at, tats
	violated := d.refusal.Violated
	var retry int64
	for i, p := range policies {
		var tat int64
		if !tats[i].IsZero() {
			tat = tats[i].UnixMicro()
		}
		d.states[i] = stateOf(p, now, tat)
		if !allowed {
			t := p.emission()
			if over := max(now, tat) + t*int64(cost) - t*int64(p.burst()) - now; over > 0 {
				violated = append(violated, p.Name)
				retry = max(retry, over)
			}
		}
	}
	if allowed {
		d.refusal = nil
		return d, nil
	}
	if len(violated) == 0 {
		return nil, fmt.Errorf("ratelimit: the database refused a request its returned state admits (policies %v at %v)", names(policies), at)
	}
	*d.refusal = LimitError{Name: l.name, Violated: violated, Limit: limitOf(policies, violated[0]),
		RetryAfter: time.Duration(retry) * time.Microsecond, Cost: cost, Policies: d.states, At: at}
	return d, nil
}

// judgedOne is a decision under one policy, allocated at once.
type judgedOne struct {
	d        decision
	states   [1]PolicyState
	le       LimitError
	violated [1]string
}

// stateOf is policy p's state at now (µs) for a key whose TAT is tat (µs;
// 0: none).
func stateOf(p Policy, now, tat int64) PolicyState {
	t := p.emission()
	burst := int64(p.burst())
	tol := t * burst
	base := max(now, tat)
	avail := max(now+tol-base, 0) // µs of burst left
	remaining := min(avail/t, burst)
	var reset int64
	if base > now {
		reset = (remaining+1)*t - avail
	}
	return PolicyState{Policy: p, Remaining: int(remaining), Reset: time.Duration(reset) * time.Microsecond}
}

func names(ps []Policy) []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.Name
	}
	return out
}
