package main

import (
	"fmt"
	"math"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"
)

// Slugs of the refusals the load check expects (REFERENCE-SERVICE.md).
const (
	slugHeavy    = "too-many-heavy-requests"
	slugSignIn   = "too-many-failed-sign-ins"
	slugUploads  = "too-many-uploads"
	slugInFlight = "too-many-requests-in-flight"
	slugInvalid  = "invalid-credentials"
	slugRate     = "too-many-requests"
)

// kind is what a request exercised.
type kind int

const (
	kindConsole kind = iota
	kindSignIn
	kindUpload
	kindNode
	kindRate
	kindAddress
)

// never is the end of a request whose end the client does not know (a
// transport error or a time-out): the server may still be working on it, so
// it counts as a possible holder until the end of time.
const never = time.Duration(1<<63 - 1)

// record is one request as the client saw it: the ledger entry every
// judgement is made from. start and end are offsets from the start of the
// run: start just before the request was sent, end once the whole answer was
// read.
type record struct {
	kind  kind
	user  string // the user the token belongs to (console, upload, node)
	token string // the token's label (console, upload, node)
	key   string // the username tried (sign-in)
	// addr is the client address the request claims through the trusted
	// proxy (X-Forwarded-For): the address rate's key (address, sign-in);
	// "" for a request sent straight from 127.0.0.1.
	addr   string
	start  time.Duration
	end    time.Duration
	status int     // 0: no answer (err)
	slug   string  // the problem type slug of a problem+json answer
	scope  string  // the scope member of a heavy refusal
	share  float64 // rate.replica of a queue listing: the replica's node share
	ready  int     // rate.readyReplicas of a queue listing
	// rateHeaders: the answer carried RateLimit-Policy and RateLimit with
	// the policy "api"; addressHeaders with the policy "address".
	rateHeaders, addressHeaders bool
	err                         error
}

// refusedBy reports whether r was refused with slug.
func (r *record) refusedBy(slug string) bool { return r.status == 429 && r.slug == slug }

// unauthenticated reports whether r never got past authentication.
func (r *record) unauthenticated() bool { return r.status == 401 && r.slug == "unauthorized" }

// expected reports whether r's answer is one the load check expects for its
// kind; anything else (a 5xx, a transport error, a time-out) is reported as
// unexpected.
func (r *record) expected() bool {
	if r.err != nil {
		return false
	}
	if r.refusedBy(slugBanned) && r.kind != kindSignIn {
		// Every request a rate limit counts may be banned (judged, and
		// reported unexpected when bans are off, by judge).
		return true
	}
	switch r.kind {
	case kindConsole:
		return r.status == 200 || r.refusedBy(slugHeavy) || r.refusedBy(slugInFlight) || r.refusedBy(slugRate)
	case kindSignIn:
		return (r.status == 401 && r.slug == slugInvalid) || r.refusedBy(slugSignIn)
	case kindUpload:
		return r.status == 201 || r.refusedBy(slugUploads) || r.refusedBy(slugInFlight) || r.refusedBy(slugRate)
	case kindAddress:
		return r.unauthenticated() || (r.refusedBy(slugRate) && r.scope == "address")
	case kindNode, kindRate:
		return r.status == 200 || r.refusedBy(slugInFlight) || r.refusedBy(slugRate)
	}
	return false
}

// rule says how to find the false refusals of one limit in the ledger.
//
// A refusal R is false when, by the ledger, fewer than cap other requests of
// the same scope can have held a slot at any moment of R's life. A request
// i can have held a slot at a moment of R's life only if it was sent before
// R's answer came (i.start < R.end) and it may still have held the slot
// after R was sent (i.end + hold + slack > R.start), where hold is how long a
// slot outlives its request (0 for a permit released when the request ends;
// the window for an upload or a failed sign-in) and slack covers a release
// that happens after the client has read the answer. Requests that cannot
// have taken a slot (holds false: refused before the claim, or refused by
// this very limit) are not counted. Only the load check drives the service,
// so every possible holder is in the ledger: the rule can miss a false
// refusal but never invents one.
type rule struct {
	// in selects the requests of this limit (refusals and holders alike).
	in func(*record) bool
	// scope groups them: only requests of one scope compete.
	scope func(*record) string
	// refused selects the refusals by this limit.
	refused func(*record) bool
	// holds selects the requests that can have held a slot.
	holds func(*record) bool
	// cap is the limit.
	cap int
	// hold is how long a slot outlives its request.
	hold time.Duration
	// slack is added to every holder's end.
	slack time.Duration
}

// judgeRefusals returns the number of refusals and of false refusals of
// rule ru in recs.
func judgeRefusals(recs []record, ru rule) (refused, falseRefused int) {
	groups := map[string][]*record{}
	for i := range recs {
		r := &recs[i]
		if ru.in(r) {
			k := ru.scope(r)
			groups[k] = append(groups[k], r)
		}
	}
	for _, g := range groups {
		for _, r := range g {
			if !ru.refused(r) {
				continue
			}
			refused++
			holders := 0
			for _, h := range g {
				if h == r || !ru.holds(h) {
					continue
				}
				end := h.end
				if end != never {
					end += ru.hold + ru.slack
				}
				if h.start < r.end && end > r.start {
					holders++
					if holders >= ru.cap {
						break
					}
				}
			}
			if holders < ru.cap {
				falseRefused++
				if os.Getenv("LOADCHECK_DEBUG") != "" {
					fmt.Fprintf(os.Stderr, "FALSE REFUSAL %+v\n", *r)
					for _, h := range g {
						if h.start < r.end+200*time.Millisecond && h.end+200*time.Millisecond > r.start {
							fmt.Fprintf(os.Stderr, "   near %+v holds=%v\n", *h, ru.holds(h))
						}
					}
				}
			}
		}
	}
	return refused, falseRefused
}

// maxInWindow returns the most successes of one scope whose whole requests
// (send to answer) fit in an interval shorter than window: their claims
// then all happened less than window apart, so every one of them held a
// slot of the rolling window at the moment of the last claim. More than
// the limit is an over-grant, whatever the observation lag.
func maxInWindow(recs []record, in func(*record) bool, scope func(*record) string, window time.Duration) int {
	groups := map[string][]*record{}
	for i := range recs {
		r := &recs[i]
		if in(r) {
			groups[scope(r)] = append(groups[scope(r)], r)
		}
	}
	best := 0
	for _, g := range groups {
		sort.Slice(g, func(i, j int) bool { return g[i].start < g[j].start })
		for i, first := range g {
			n := 0
			for _, r := range g[i:] {
				if r.end-first.start < window {
					n++
				}
			}
			best = max(best, n)
		}
	}
	return best
}

// countBy returns the largest number of requests of one scope selected by in.
func countBy(recs []record, in func(*record) bool, scope func(*record) string) int {
	n := map[string]int{}
	best := 0
	for i := range recs {
		if r := &recs[i]; in(r) {
			n[scope(r)]++
			best = max(best, n[scope(r)])
		}
	}
	return best
}

// callsPerSecond counts calls by Unix second over the whole seconds that
// start at least a second after from and end by to, and returns the most in
// one second, the counts of those seconds in order, and the calls counted.
// The replicas' token buckets start full (the burst the ADR allows: one
// second of each replica's share, spent by the first calls); a second that
// starts a second after the load began starts with the buckets empty.
func callsPerSecond(calls []time.Time, from, to time.Time) (most int, series []int, total int) {
	first := from.Add(time.Second).Truncate(time.Second)
	if first.Before(from.Add(time.Second)) {
		first = first.Add(time.Second)
	}
	last := to.Truncate(time.Second) // seconds from first up to, not including, last
	if !last.After(first) {
		return 0, nil, 0
	}
	series = make([]int, int(last.Sub(first)/time.Second))
	for _, at := range calls {
		if at.Before(first) || !at.Before(last) {
			continue
		}
		series[int(at.Sub(first)/time.Second)]++
		total++
	}
	for _, n := range series {
		most = max(most, n)
	}
	return most, series, total
}

// nodeExcess judges the node's calls against the node limiter's stated
// bound. The limiter lets each replica's calls go at most share × (1 + L)
// in any interval of length L, however late the replica runs (nodelimit:
// a call takes its token when it goes), so the replicas together at most
// burst + perSecond × L, with burst and perSecond both replicas × share.
// The node stamps a call when the kernel received its first byte, a moment
// after its turn: the replica's own sending of it (the request handed to
// its connection's writer, the write), at most delivery later. A call
// whose turn came before an interval and whose stamp falls within it took
// its token before the interval, so the bucket it came from holds that
// much less at the interval's start, short of what it earned in the
// meantime, the most delivery × its share: the node sees at most
// burst + perSecond × (L + delivery) calls in any interval of length L. at
// is sorted; nodeExcess returns the most the calls of any interval between
// two of them (both counted) exceed that bound (above 0: exceeded), and
// the interval: how many, from when, how long.
func nodeExcess(at []time.Time, burst int, perSecond float64, delivery time.Duration) (excess float64, count int, from time.Time, length time.Duration) {
	excess = math.Inf(-1)
	for i := range at {
		for j := i; j < len(at); j++ {
			l := at[j].Sub(at[i])
			if e := float64(j-i+1) - float64(burst) - perSecond*(l+delivery).Seconds(); e > excess {
				excess, count, from, length = e, j-i+1, at[i], l
			}
		}
	}
	if len(at) == 0 {
		excess = 0
	}
	return excess, count, from, length
}

// hasRateHeaders reports whether h carries RateLimit-Policy and RateLimit
// items of the policy "api" (the fields are lists, possibly over several
// lines, beside other limits' items).
func hasRateHeaders(h http.Header, policy string) bool {
	has := func(name string) bool {
		for _, v := range h.Values(name) {
			for _, item := range strings.Split(v, ",") {
				if strings.HasPrefix(strings.TrimSpace(item), `"`+policy+`";`) {
					return true
				}
			}
		}
		return false
	}
	return has("RateLimit-Policy") && has("RateLimit")
}

// byUser groups the requests made with a token by the token's user, in the
// order they were sent: the API rate is kept per user, every token of the
// user together (a new sign-in does not buy a new rate).
func byUser(recs []record) map[string][]*record {
	return groupBy(recs, func(r *record) string {
		if r.token == "" {
			return ""
		}
		return r.user
	})
}

// byAddress groups the requests without a token that the address rate
// counted, by their client address.
func byAddress(recs []record) map[string][]*record {
	return groupBy(recs, func(r *record) string {
		if r.token != "" {
			return ""
		}
		return r.addr
	})
}

// groupBy groups recs by key ("" left out), each group in send order.
func groupBy(recs []record, key func(*record) string) map[string][]*record {
	groups := map[string][]*record{}
	for i := range recs {
		r := &recs[i]
		if k := key(r); k != "" {
			groups[k] = append(groups[k], r)
		}
	}
	for _, g := range groups {
		sort.Slice(g, func(i, j int) bool { return g[i].start < g[j].start })
	}
	return groups
}

// rateExcess is the most requests of one user the rate limit admitted in
// an interval, less perSecond × the interval, over every user and every
// interval between two admitted requests, measured from the first one's
// send to the last one's answer. Those requests were all decided within
// that interval, so with GCRA the excess is at most the burst; the
// interval as the client measures it is longer than the real one by the
// requests' latency, so the excess can only be underestimated: a value
// above the burst is an over-grant, whatever the timing. where names the
// user and interval of the highest.
func rateExcess(groups map[string][]*record, perSecond float64, passed func(*record) bool) (excess float64, where string) {
	for user, g := range groups {
		var admitted []*record
		for _, r := range g {
			if r.err == nil && r.status != 0 && !r.refusedBy(slugRate) && passed(r) {
				admitted = append(admitted, r)
			}
		}
		for i, first := range admitted {
			last := first.end
			for j := i; j < len(admitted); j++ {
				last = max(last, admitted[j].end)
				if e := float64(j-i+1) - perSecond*(last-first.start).Seconds(); e > excess {
					excess = e
					where = fmt.Sprintf("; highest for %s: %d admitted in %v from %.3fs", user, j-i+1,
						(last - first.start).Round(time.Millisecond), first.start.Seconds())
				}
			}
		}
	}
	return excess, where
}

// judgeRate returns the number of rate refusals and of false ones. A
// refusal R (sent at s0, answered at s1) is false when the ledger proves
// the user had room at every moment R may have been decided: GCRA refuses
// at t only if, for some u <= t, the requests admitted in [u, t] plus this
// one exceed burst + perSecond × (t-u). Counting as admitted in [u, t]
// every request of the user that may have been (sent before s1, answered
// after u, not refused by the rate limit; one without an answer always),
// and taking t = s0 for the allowance, a refusal that still fits for
// every u was false. Only the load check drives the service, so the rule
// can miss a false refusal but never invents one.
func judgeRate(groups map[string][]*record, perSecond float64, burst int, slack time.Duration, passed func(*record) bool) (refused, falseRefused int) {
	for _, g := range groups {
		for _, r := range g {
			if !r.refusedBy(slugRate) {
				continue
			}
			refused++
			var ends []time.Duration // possible holders' last possible decision times
			for _, h := range g {
				if h == r || h.refusedBy(slugRate) || (h.err == nil && !passed(h)) || h.start >= r.end {
					continue
				}
				end := h.end
				if end != never {
					end += slack
				}
				ends = append(ends, end)
			}
			sort.Slice(ends, func(i, j int) bool { return ends[i] < ends[j] })
			fits := true
			// u just before each possible end up to R's send, and u = R's send.
			for k, e := range ends {
				if e > r.start {
					break
				}
				if float64(len(ends)-k+1) > float64(burst)+perSecond*(r.start-e).Seconds() {
					fits = false
					break
				}
			}
			if fits {
				later := 0
				for _, e := range ends {
					if e > r.start {
						later++
					}
				}
				fits = later+1 <= burst
			}
			if fits {
				falseRefused++
			}
		}
	}
	return refused, falseRefused
}
