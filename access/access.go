// Package access keeps allow and deny lists as data, in force on every
// replica of a service: a rule matches a client address or a range of them
// (an IPv4 or IPv6 CIDR), or a key ("user:alice", "token:42"), and may
// lapse at a time. A service denies what a deny rule matches before any
// other work, and exempts what an allow rule matches from its rate limits
// (middleware/rules is the HTTP side of both; middleware/ratelimit's
// Options.Exempt takes the exemption, as does middleware/signin's for an
// address's sign-in throttle). Housekeeping deletes a rule once it has
// lapsed.
//
// What it guarantees: the rules live in the LOGGED table
// pglimit.access_rule (configuration: a crash of the database does not
// lift a deny list). Add and Remove change a row and notify every replica
// on the invalidation bus in the same transaction; each replica's Rules
// reloads the whole list when it hears it, when its bus connects again
// (it may have missed one), and once a second while it has no bus — so a
// change is in force on every replica within about a second of its
// commit, and on the replica that made it when Add or Remove returns.
// Deny wins: a request that matches a deny rule is denied whatever else
// it matches. A rule stops matching at its expiry, judged on this
// replica's clock mapped from the database's at the last load, never
// later than the database's time, with no reload.
//
// What it costs: Match runs no statement and allocates nothing: the
// address is found by a binary search in a sorted array of the rules'
// prefixes (CIDRs nest or are disjoint, so the prefixes that contain an
// address are a chain of parents from the last one that starts before
// it), a key by a map lookup. At 10,000 rules it takes 45 to 170
// nanoseconds (BenchmarkMatch; BENCHMARKS.md's row). A reload is one statement
// that reads the table whole, and a rule costs about 100 bytes of memory
// per replica.
//
// How it fails: a reload that fails keeps the lists loaded before (logged
// at WARN, once per incident) and is tried again every second; New fails
// when the first load does. A Rules is safe for concurrent use.
package access

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/dberr"
	"github.com/pglimit/pglimit/internal/netaddr"
)

// List is a rule's list, and what Match found: None, Allow or Deny.
type List uint8

// The lists.
const (
	// None: no rule matched (never a rule's list).
	None List = iota
	// Allow: an allow rule matched, and no deny rule.
	Allow
	// Deny: a deny rule matched.
	Deny
)

// String is "none", "allow" or "deny": how pglimit.access_rule and the
// reference service's API name the lists.
func (l List) String() string {
	switch l {
	case Allow:
		return "allow"
	case Deny:
		return "deny"
	}
	return "none"
}

// Rule is one entry of a list.
type Rule struct {
	// ID identifies the rule (Remove); set by Add.
	ID int64
	// List is Allow or Deny.
	List List
	// Match is what the rule matches: an IPv4 or IPv6 address
	// ("192.0.2.7"), a CIDR ("192.0.2.0/24", "2001:db8::/48"), or a key,
	// "kind:value" ("user:alice", "token:42"; kind is a lowercase letter,
	// then up to 31 lowercase letters, digits, '_' or '-'; value is not
	// empty, has no control characters, and the whole is at most 256
	// bytes). Add stores it normalised: a CIDR with its host bits cleared,
	// an IPv4-mapped IPv6 address or CIDR as IPv4, an address without a
	// prefix length; text that has only the characters of an address
	// (hex digits, ':', '.', '/') is read as one.
	Match string
	// ExpiresIn is how long after Add the rule lapses (0: never; at most
	// 100 years). Add only; List leaves it zero.
	ExpiresIn time.Duration
	// ExpiresAt is when the rule lapses, on the database clock (zero:
	// never). Set by Add and List.
	ExpiresAt time.Time
}

// FieldError is Add's refusal of a rule: Field names the Rule field at
// fault as the reference service's API names it ("list", "match",
// "expiresIn") and Reason says what is wrong with it.
type FieldError struct {
	Field  string
	Reason string
}

func (e *FieldError) Error() string { return "access: rule " + e.Field + ": " + e.Reason }

// Options configure Rules. The zero value is ready to use.
type Options struct {
	// Logger receives the reload failures and the warning of a rule for
	// every address (a /0). Default slog.Default().
	Logger *slog.Logger
	// Timeout bounds each statement when the caller's context has no
	// sooner deadline. Default 5s.
	Timeout time.Duration
}

// Rules is the allow and deny lists of one database, as this replica
// holds them. It is safe for concurrent use.
type Rules struct {
	pool    *pgxpool.Pool
	q       *db.Queries
	log     *slog.Logger
	timeout time.Duration
	bus     *bus.Bus
	sub     *bus.Subscription
	changed chan struct{}

	snap atomic.Pointer[table]

	loadMu   sync.Mutex // one load at a time: the newest read is the one kept
	loadedAt time.Time
	epoch    uint64
	failing  atomic.Bool
}

// How often Run looks at the bus, reloads without one, and reloads anyway.
const (
	tick       = 100 * time.Millisecond
	pollNoBus  = time.Second
	pollAnyway = time.Minute
)

// New loads the lists of pool's database (which must have pglimit's
// schema) and returns them; Run keeps them current.
func New(ctx context.Context, pool *pgxpool.Pool, opts Options) (*Rules, error) {
	if pool == nil {
		return nil, errors.New("access: nil pool")
	}
	if opts.Timeout < 0 {
		return nil, errors.New("access: negative Options.Timeout")
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	r := &Rules{pool: pool, q: db.New(), log: opts.Logger, timeout: opts.Timeout, bus: bus.For(pool),
		changed: make(chan struct{}, 1)}
	r.snap.Store(&table{})
	signal := func() {
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
	r.sub = r.bus.Subscribe(bus.TopicAccess, func(string) { signal() }, signal)
	if err := r.reload(ctx); err != nil {
		r.sub.Close()
		return nil, fmt.Errorf("access: loading the rules: %w", err)
	}
	return r, nil
}

// Run keeps the lists current until ctx ends, and returns nil then: it
// reloads them when the bus says they changed, when the bus turns Live
// again (it may have missed a change meanwhile), every second while there
// is no bus (pglimit.Run runs the bus), and every minute in any case.
func (r *Rules) Run(ctx context.Context) error {
	t := time.NewTicker(tick)
	defer t.Stop()
	var lastTry time.Time
	pending := false // a change heard while reloads fail, for the next try
	for {
		need := pending
		select {
		case <-ctx.Done():
			return nil
		case <-r.changed:
			need = true
		case <-t.C:
		}
		r.loadMu.Lock()
		since, epoch := time.Since(r.loadedAt), r.epoch
		r.loadMu.Unlock()
		live := r.bus.Live()
		switch {
		case need:
		case live && r.bus.Epoch() != epoch:
			need = true
		case !live && since >= pollNoBus:
			need = true
		case since >= pollAnyway:
			need = true
		}
		if !need || (r.failing.Load() && time.Since(lastTry) < pollNoBus) {
			pending = need
			continue
		}
		lastTry, pending = time.Now(), false
		if err := r.reload(ctx); err != nil {
			pending = true
			if ctx.Err() != nil {
				return nil
			}
			if !r.failing.Swap(true) {
				r.log.WarnContext(ctx, "pglimit: the allow and deny lists could not be reloaded; the lists loaded before stay in force until a reload succeeds",
					"err", err)
			}
			continue
		}
		if r.failing.Swap(false) {
			r.log.InfoContext(ctx, "pglimit: the allow and deny lists are reloaded again")
		}
	}
}

// reload reads every rule in force and swaps the lists in.
func (r *Rules) reload(ctx context.Context) error {
	r.loadMu.Lock()
	defer r.loadMu.Unlock()
	// The epoch before the statement: a bus that turns Live meanwhile
	// makes Run reload again.
	epoch := r.bus.Epoch()
	ctx, cancel := dberr.WithTimeout(ctx, r.timeout)
	defer cancel()
	sent := time.Now()
	rows, err := r.q.AccessRuleLive(ctx, r.pool)
	if err != nil {
		return dberr.OwnTimeout(ctx, err)
	}
	t := build(rows, sent)
	r.snap.Store(t)
	r.loadedAt, r.epoch = sent, epoch
	return nil
}

// Add checks rule, stores it and puts it in force: on this replica when
// Add returns, on every other within about a second. It returns the rule
// as stored (ID, normalised Match, ExpiresAt). A rule that cannot be used
// is a *FieldError naming the field; a rule for every address (0.0.0.0/0,
// ::/0) is taken, and logged at WARN.
func (r *Rules) Add(ctx context.Context, rule Rule) (Rule, error) {
	if rule.List != Allow && rule.List != Deny {
		return Rule{}, &FieldError{Field: "list", Reason: `must be "allow" or "deny"`}
	}
	match, prefix, err := normalise(rule.Match)
	if err != nil {
		return Rule{}, err
	}
	switch {
	case rule.ExpiresIn < 0:
		return Rule{}, &FieldError{Field: "expiresIn", Reason: "must not be negative (0: never lapses)"}
	case rule.ExpiresIn > maxExpiresIn:
		return Rule{}, &FieldError{Field: "expiresIn", Reason: "must be at most 100 years"}
	}
	us := rule.ExpiresIn.Microseconds()
	if rule.ExpiresIn > 0 && us == 0 {
		us = 1
	}
	ctx, cancel := dberr.WithTimeout(ctx, r.timeout)
	defer cancel()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return Rule{}, fmt.Errorf("access: add: %w", dberr.OwnTimeout(ctx, err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	row, err := r.q.AccessRuleAdd(ctx, tx, &db.AccessRuleAddParams{ListName: rule.List.String(), RuleMatch: match, ExpiresInUs: us})
	if err == nil {
		err = r.q.BusNotify(ctx, tx, bus.TopicAccess)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return Rule{}, fmt.Errorf("access: add: %w", dberr.OwnTimeout(ctx, err))
	}
	if prefix.IsValid() && prefix.Bits() == 0 {
		r.log.WarnContext(ctx, "pglimit: an access rule for every address", "list", rule.List.String(), "match", match, "id", row.ID)
	}
	r.afterChange(ctx)
	return ruleOf(row.ID, row.List, row.Match, row.ExpiresAt), nil
}

// Remove takes the rule id out of force: on this replica when Remove
// returns, on every other within about a second. It reports whether there
// was such a rule.
func (r *Rules) Remove(ctx context.Context, id int64) (bool, error) {
	ctx, cancel := dberr.WithTimeout(ctx, r.timeout)
	defer cancel()
	tx, err := r.pool.Begin(ctx)
	if err != nil {
		return false, fmt.Errorf("access: remove: %w", dberr.OwnTimeout(ctx, err))
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	n, err := r.q.AccessRuleRemove(ctx, tx, id)
	if err == nil && n > 0 {
		err = r.q.BusNotify(ctx, tx, bus.TopicAccess)
	}
	if err == nil {
		err = tx.Commit(ctx)
	}
	if err != nil {
		return false, fmt.Errorf("access: remove: %w", dberr.OwnTimeout(ctx, err))
	}
	if n > 0 {
		r.afterChange(ctx)
	}
	return n > 0, nil
}

// afterChange reloads this replica's lists after its own change, or
// leaves it to Run when that fails.
func (r *Rules) afterChange(ctx context.Context) {
	if err := r.reload(ctx); err != nil {
		select {
		case r.changed <- struct{}{}:
		default:
		}
	}
}

// List returns every rule in force, in the order added, read from the
// database.
func (r *Rules) List(ctx context.Context) ([]Rule, error) {
	ctx, cancel := dberr.WithTimeout(ctx, r.timeout)
	defer cancel()
	rows, err := r.q.AccessRuleLive(ctx, r.pool)
	if err != nil {
		return nil, fmt.Errorf("access: list: %w", dberr.OwnTimeout(ctx, err))
	}
	out := make([]Rule, 0, len(rows))
	for _, row := range rows {
		out = append(out, ruleOf(row.ID, row.List, row.Match, row.ExpiresAt))
	}
	return out, nil
}

func ruleOf(id int64, list, match string, expires pgtype.Timestamptz) Rule {
	rule := Rule{ID: id, List: Allow, Match: match}
	if list == "deny" {
		rule.List = Deny
	}
	if expires.Valid {
		rule.ExpiresAt = expires.Time
	}
	return rule
}

// Match tells which list the client at addr, known by keys (each
// "kind:value", as rules name them), is on: Deny if a deny rule matches
// the address or any key, else Allow if an allow rule does, else None. An
// invalid addr matches no address rule; an IPv4-mapped IPv6 address is
// matched as IPv4, and a zone is ignored. No statement, no allocation.
func (r *Rules) Match(addr netip.Addr, keys ...string) List {
	t := r.snap.Load()
	var allowUntil, denyUntil int64
	if addr.IsValid() && (len(t.v4) > 0 || len(t.v6) > 0) {
		addr = addr.Unmap()
		if addr.Is4() {
			b := addr.As4()
			allowUntil, denyUntil = t.match4(uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3]))
		} else {
			allowUntil, denyUntil = t.match6(u128Of(addr))
		}
	}
	if len(t.keys) > 0 {
		for _, k := range keys {
			if u, ok := t.keys[k]; ok {
				allowUntil, denyUntil = max(allowUntil, u.allow), max(denyUntil, u.deny)
			}
		}
	}
	if allowUntil == 0 && denyUntil == 0 {
		return None
	}
	now := int64(time.Since(base))
	switch {
	case denyUntil > now:
		return Deny
	case allowUntil > now:
		return Allow
	}
	return None
}

// maxExpiresIn bounds Rule.ExpiresIn.
const maxExpiresIn = 100 * 365 * 24 * time.Hour

// maxMatch bounds a key's text.
const maxMatch = 256

// normalise checks a rule's Match and returns its stored form, and its
// prefix when it is an address rule.
func normalise(s string) (string, netip.Prefix, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: "empty: give an address, a CIDR or a key such as user:NAME"}
	}
	if strings.Trim(s, "0123456789abcdefABCDEF:./") == "" {
		p, err := parsePrefix(s)
		if err != nil {
			return "", netip.Prefix{}, &FieldError{Field: "match", Reason: err.Error()}
		}
		if p.IsSingleIP() {
			return p.Addr().String(), p, nil
		}
		return p.String(), p, nil
	}
	if strings.ContainsRune(s, '%') {
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: "an address with a zone (%) cannot be a rule"}
	}
	kind, value, ok := strings.Cut(s, ":")
	switch {
	case !ok:
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: fmt.Sprintf("%q is not an address, a CIDR or a key kind:value (user:NAME, token:ID)", clip(s))}
	case !validKind(kind):
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: "a key's kind (before ':') is a lowercase letter, then up to 31 lowercase letters, digits, '_' or '-'"}
	case value == "":
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: "a key's value (after ':') is empty"}
	case len(s) > maxMatch:
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: fmt.Sprintf("a key is at most %d bytes", maxMatch)}
	case !utf8.ValidString(value) || strings.IndexFunc(value, unicode.IsControl) >= 0:
		return "", netip.Prefix{}, &FieldError{Field: "match", Reason: "a key's value must be UTF-8 without control characters"}
	}
	return s, netip.Prefix{}, nil
}

func clip(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

func validKind(k string) bool {
	if k == "" || len(k) > 32 || k[0] < 'a' || k[0] > 'z' {
		return false
	}
	for _, c := range []byte(k) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// parsePrefix reads an address or a CIDR (netaddr.ParsePrefix: host bits
// cleared, IPv4-mapped IPv6 as IPv4); its error names the text, clipped.
func parsePrefix(s string) (netip.Prefix, error) {
	p, err := netaddr.ParsePrefix(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q %w", clip(s), err)
	}
	return p, nil
}

// base is the origin of the lists' times: nanoseconds since it, on this
// process's monotonic clock.
var base = time.Now()

// never is the time of a rule that does not lapse.
const never = math.MaxInt64

// until is when a prefix's or key's allow and deny rules lapse, in
// nanoseconds since base: 0 when it has none on that list, never when
// one never lapses.
type until struct{ allow, deny int64 }

func (u *until) add(list string, t int64) {
	if list == "deny" {
		u.deny = max(u.deny, t)
	} else {
		u.allow = max(u.allow, t)
	}
}

// u128 is an IPv6 address as a number.
type u128 struct{ hi, lo uint64 }

func u128Of(a netip.Addr) u128 {
	b := a.As16()
	var x u128
	for i := range 8 {
		x.hi = x.hi<<8 | uint64(b[i])
		x.lo = x.lo<<8 | uint64(b[8+i])
	}
	return x
}

func (x u128) less(y u128) bool { return x.hi < y.hi || x.hi == y.hi && x.lo < y.lo }

// lastOf returns x with its last n bits set (n ≤ 128).
func (x u128) lastOf(n int) u128 {
	switch {
	case n >= 128:
		return u128{math.MaxUint64, math.MaxUint64}
	case n > 64:
		return u128{x.hi | (1<<(n-64) - 1), math.MaxUint64}
	case n == 64:
		return u128{x.hi, math.MaxUint64}
	case n > 0:
		return u128{x.hi, x.lo | (1<<n - 1)}
	}
	return x
}

// node is one distinct prefix of the rules: its first and last address,
// the nearest prefix that contains it (its index; -1: none), and its
// rules' times. Nodes are sorted by first address, a wider prefix before
// a narrower one of the same first address.
type node[A any] struct {
	first, last A
	parent      int32
	until
}

// table is one load of the lists, never changed after it is built.
type table struct {
	v4   []node[uint32]
	v6   []node[u128]
	keys map[string]until
}

// match4 returns the times of the rules of the prefixes that contain a.
// Prefixes nest or are disjoint, so those containing a are the last node
// that starts at or before a, if it contains a, and its parents that do.
func (t *table) match4(a uint32) (allow, deny int64) {
	v := t.v4
	lo, hi := 0, len(v)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if v[m].first <= a {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for i := lo - 1; i >= 0; i = int(v[i].parent) {
		if a <= v[i].last {
			allow, deny = max(allow, v[i].allow), max(deny, v[i].deny)
		}
	}
	return allow, deny
}

func (t *table) match6(a u128) (allow, deny int64) {
	v := t.v6
	lo, hi := 0, len(v)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if !a.less(v[m].first) {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for i := lo - 1; i >= 0; i = int(v[i].parent) {
		if !v[i].last.less(a) {
			allow, deny = max(allow, v[i].allow), max(deny, v[i].deny)
		}
	}
	return allow, deny
}

// build makes the lists of one load: rows read by a statement sent at
// sent (this replica's clock), each timed from the database's clock at
// the statement. A rule lapsing at E on the database clock lapses here at
// sent + (E − now): the database read its clock after sent, so never
// later than E.
func build(rows []*db.AccessRuleLiveRow, sent time.Time) *table {
	t := &table{}
	at := func(row *db.AccessRuleLiveRow) int64 {
		if !row.ExpiresAt.Valid {
			return never
		}
		return max(1, int64(sent.Sub(base)+row.ExpiresAt.Time.Sub(row.Now)))
	}
	v4 := map[netip.Prefix]until{}
	v6 := map[netip.Prefix]until{}
	for _, row := range rows {
		p, err := parsePrefix(row.Match)
		if err != nil || strings.Trim(row.Match, "0123456789abcdefABCDEF:./") != "" {
			if t.keys == nil {
				t.keys = map[string]until{}
			}
			u := t.keys[row.Match]
			u.add(row.List, at(row))
			t.keys[row.Match] = u
			continue
		}
		m := v6
		if p.Addr().Is4() {
			m = v4
		}
		u := m[p]
		u.add(row.List, at(row))
		m[p] = u
	}
	t.v4 = nodes(v4, func(p netip.Prefix) (uint32, uint32) {
		b := p.Addr().As4()
		first := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
		return first, first | uint32(uint64(1)<<(32-p.Bits())-1)
	}, func(a, b uint32) int { return cmp.Compare(a, b) })
	t.v6 = nodes(v6, func(p netip.Prefix) (u128, u128) {
		first := u128Of(p.Addr())
		return first, first.lastOf(128 - p.Bits())
	}, func(a, b u128) int {
		switch {
		case a.less(b):
			return -1
		case b.less(a):
			return 1
		}
		return 0
	})
	return t
}

// nodes sorts the prefixes and links each to the nearest one containing it.
func nodes[A any](m map[netip.Prefix]until, bounds func(netip.Prefix) (A, A), compare func(a, b A) int) []node[A] {
	if len(m) == 0 {
		return nil
	}
	out := make([]node[A], 0, len(m))
	for p, u := range m {
		first, last := bounds(p)
		out = append(out, node[A]{first: first, last: last, parent: int32(p.Bits()), until: u})
	}
	// parent holds the prefix length until the links are made.
	slices.SortFunc(out, func(a, b node[A]) int {
		if c := compare(a.first, b.first); c != 0 {
			return c
		}
		return cmp.Compare(a.parent, b.parent)
	})
	var stack []int32
	for i := range out {
		for len(stack) > 0 && compare(out[stack[len(stack)-1]].last, out[i].first) < 0 {
			stack = stack[:len(stack)-1]
		}
		out[i].parent = -1
		if len(stack) > 0 {
			out[i].parent = stack[len(stack)-1]
		}
		stack = append(stack, int32(i))
	}
	return out
}
