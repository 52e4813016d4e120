package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// slugBanned is the refusal of a banned key (REFERENCE-SERVICE.md).
const slugBanned = "banned"

// banPropagation is how long after a ban is made every replica refuses
// its key: the replica that bans knows at once, the others within a
// second (REFERENCE-SERVICE.md: -ban-after, the invalidation bus).
const banPropagation = time.Second

// banMargin is how long before a ban's end a request must have been
// answered to be judged as passing it: a replica maps the ban's end, on
// the database's clock, to its own through its latest statement, so it
// may let a request through up to that statement's way back before the
// end (a millisecond here, more on a loaded machine).
const banMargin = 100 * time.Millisecond

// banSpan is one ban the observer saw in the database: its key (user:NAME
// or address:ADDR) and when it began and ends, as offsets from the start of
// the run. The database runs on this machine, so its clock is the
// client's.
type banSpan struct {
	key         string
	from, until time.Duration
}

// banObserver polls the bans table in the database the replicas share, an
// observer independent of the replicas: which keys were banned, from when
// until when. A ban lasts at least -ban-for (seconds in the load check);
// the poll runs every few milliseconds, so no ban passes unseen.
//
// Its statement is a string here and not a query of sql/queries: it is the
// observer's own look at the table, deliberately not the library's.
type banObserver struct {
	conn *pgx.Conn

	mu    sync.Mutex
	spans map[banSpan]bool
	polls int
}

func newBanObserver(ctx context.Context, url string) (*banObserver, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	return &banObserver{conn: conn, spans: map[banSpan]bool{}}, nil
}

// run polls until ctx ends.
func (o *banObserver) run(ctx context.Context, t0 time.Time) error {
	defer o.conn.Close(context.Background())
	for ctx.Err() == nil {
		rows, err := o.conn.Query(ctx, `SELECT key, banned_at, until FROM pglimit.ban
			WHERE until IS NOT NULL AND banned_at IS NOT NULL`)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		var seen []banSpan
		for rows.Next() {
			var key string
			var from, until time.Time
			if err := rows.Scan(&key, &from, &until); err != nil {
				rows.Close()
				return err
			}
			seen = append(seen, banSpan{key: key, from: from.Sub(t0), until: until.Sub(t0)})
		}
		if err := rows.Err(); err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		o.mu.Lock()
		o.polls++
		for _, s := range seen {
			o.spans[s] = true
		}
		o.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil
}

// bans returns every ban seen, by key, each key's in order.
func (o *banObserver) bans() (map[string][]banSpan, int) {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := map[string][]banSpan{}
	for s := range o.spans {
		out[s.key] = append(out[s.key], s)
	}
	for _, ss := range out {
		sort.Slice(ss, func(i, j int) bool { return ss[i].from < ss[j].from })
	}
	return out, o.polls
}

// banKey is the key a request is banned under: its user when it carries a
// token (the API rate's key), its client address when it has none (the
// address rate's); "" for a request neither counts.
func banKey(r *record) string {
	switch {
	case r.token != "" && r.user != "":
		return "user:" + r.user
	case r.token == "" && r.addr != "":
		return "address:" + r.addr
	}
	return ""
}

// rateRefusal reports whether r was refused by the rate limit of its ban
// key: the API rate (scope user) for a token, the address rate without one.
// Those refusals, and only those, count toward a ban.
func rateRefusal(r *record) bool {
	if !r.refusedBy(slugRate) {
		return false
	}
	if r.token != "" {
		return r.scope != "address"
	}
	return r.scope == "address"
}

// banJudgement is the bans row's verdict from the client's ledger and the
// observer's bans.
type banJudgement struct {
	// banned is the number of 429 banned answers; falseBans those the
	// ledger or the observer cannot justify.
	banned, falseBans int
	// passed is the number of requests that passed a ban in force: sent at
	// least banPropagation after it began, answered before it ended, and
	// not refused as banned.
	passed int
	// inForce is the number of requests judged for passing: sent and
	// answered while a ban of their key was in force on every replica.
	inForce int
	// keys is the number of keys banned; spans the bans seen.
	keys, spans int
	// where names the first false ban or pass found.
	where string
}

// judgeBans judges the bans. A banned answer R is false unless
//
//   - the observer saw a ban of R's key in force at some moment of R's life
//     (it began before R was answered and ended after R was sent), and
//   - the ledger holds at least after-1 rate refusals of that key that can
//     have been counted toward it (the refusal that bans is itself
//     answered 429 banned, and only it: another replica's refusal counted
//     once the key is banned adds nothing): the ban began before R was answered and
//     was still in force after R was sent, so it began after R's send less
//     banFor; the refusals it counted were decided within `within` before
//     it began. Every refusal sent before R was answered and answered after
//     R's send less banFor and within may have been one of them.
//
// A request passed a ban when it was sent banPropagation or more after the
// ban began (every replica knew of it), was answered before the ban ended,
// and was not refused as banned: whatever else its answer was, it reached
// a limit the ban should have kept it from. Only the load check drives the
// service, so the refusals in the ledger are every refusal of its keys:
// the rule can miss a false ban but never invents one.
func judgeBans(recs []record, bans map[string][]banSpan, after int, within, banFor, slack time.Duration) banJudgement {
	var j banJudgement
	byKey := groupBy(recs, banKey)
	for _, ss := range bans {
		j.keys++
		j.spans += len(ss)
	}
	keys := make([]string, 0, len(byKey))
	for k := range byKey {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, key := range keys {
		g := byKey[key]
		for _, r := range g {
			if r.err != nil {
				continue
			}
			for _, s := range bans[key] {
				if r.start >= s.from+banPropagation && r.end != never && r.end+banMargin <= s.until {
					j.inForce++
					break
				}
			}
			if r.refusedBy(slugBanned) {
				j.banned++
				seen := false
				for _, s := range bans[key] {
					if s.from <= r.end+slack && s.until+slack >= r.start {
						seen = true
						break
					}
				}
				counted := 0
				for _, h := range g {
					if rateRefusal(h) && h.start < r.end && (h.end == never || h.end+slack > r.start-banFor-within) {
						counted++
					}
				}
				if !seen || counted+1 < after {
					j.falseBans++
					if j.where == "" {
						j.where = fmt.Sprintf("%s banned from %.3fs to %.3fs: ban seen in the database %v, %d rate refusals that may have counted (ban after %d)",
							key, r.start.Seconds(), r.end.Seconds(), seen, counted, after)
					}
				}
				continue
			}
			for _, s := range bans[key] {
				if r.start >= s.from+banPropagation && r.end != never && r.end+banMargin <= s.until {
					j.passed++
					if j.where == "" {
						j.where = fmt.Sprintf("%s passed a ban (%.3fs to %.3fs) with %d %s, sent at %.3fs and answered at %.3fs",
							key, s.from.Seconds(), s.until.Seconds(), r.status, r.slug, r.start.Seconds(), r.end.Seconds())
					}
					break
				}
			}
		}
	}
	return j
}
