package ratelimit_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/ratelimit"
)

// The model the limiter is held to, written from the rule the package
// documents and from nothing the package computes: a policy of Limit per
// Window with burst B and unit time T = Window/Limit (rounded up to a
// microsecond) admits, in any interval [s, t], at most B + (t-s)/T units.
// A request is refused justly only when admitting it would break that for
// some policy and some interval ending at its time; otherwise the refusal
// was avoidable. The record is each decision's time (on the database
// clock, as the answer gives it), cost and outcome.

// record is one decision as the test saw it.
type record struct {
	at       int64 // µs, database clock
	cost     int
	admitted bool
	// retry is the refusal's RetryAfter, µs (refusals only).
	retry int64
	// violated are the refusal's violated policies.
	violated []string
	// sent and received bound the decision on the test's clock (the same
	// machine's clock as the database's).
	sent, received int64
}

type modelPolicy struct {
	name  string
	t     int64 // µs per unit, rounded up
	burst int64
}

func modelOf(ps []ratelimit.Policy) []modelPolicy {
	out := make([]modelPolicy, len(ps))
	for i, p := range ps {
		b := p.Burst
		if b == 0 {
			b = p.Limit
		}
		w := p.Window.Microseconds()
		out[i] = modelPolicy{name: p.Name, t: (w + int64(p.Limit) - 1) / int64(p.Limit), burst: int64(b)}
	}
	return out
}

// verdict is what the model says of a record.
type verdict struct {
	admitted  int     // units admitted
	requests  int     // admitted requests
	refusals  int     // refused requests
	avoidable int     // refusals the model says had room
	worst     float64 // highest admitted units / bound over all intervals
	badRetry  int     // refusals whose RetryAfter differs from the model's
	badOrder  int     // decisions whose time is outside [sent, received]
	// runBound is, per policy, burst + rate × the run (first decision to
	// last): what the limiter could admit at most over the whole run;
	// reach is the same in units.
	runBound []string
	reach    []float64
	examples []string
}

func (v verdict) String() string {
	return fmt.Sprintf("admitted %d units in %d requests (bound over the run: %s), %d refusals, %d avoidable, worst interval at %.3f of its bound, %d wrong Retry-After, %d times out of order",
		v.admitted, v.requests, strings.Join(v.runBound, ", "), v.refusals, v.avoidable, v.worst, v.badRetry, v.badOrder)
}

func (v *verdict) example(format string, args ...any) {
	if len(v.examples) < 5 {
		v.examples = append(v.examples, fmt.Sprintf(format, args...))
	}
}

// judge holds the records (any order) to the model of policies.
func judge(policies []ratelimit.Policy, recs []record) verdict {
	ps := modelOf(policies)
	recs = slices.Clone(recs)
	slices.SortStableFunc(recs, func(a, b record) int { return int(a.at - b.at) })
	var v verdict
	const slack = 2000 // µs: the database reads the clock between send and receive; truncation
	var admitted []record
	for _, r := range recs {
		if r.sent != 0 && (r.at < r.sent-slack || r.at > r.received+slack) {
			v.badOrder++
			v.example("decision at %d outside [%d, %d]", r.at, r.sent, r.received)
		}
		if r.admitted {
			admitted = append(admitted, r)
			v.admitted += r.cost
			v.requests++
			continue
		}
		v.refusals++
		// The model's wait for each policy: the latest of
		// at_j + T*(S_j + c) - T*B - t over the admitted j before t (S_j:
		// units admitted from j on), or, for a cost above the burst, never.
		var retry int64
		var violated []string
		never := false
		for _, p := range ps {
			c := int64(r.cost)
			if c > p.burst {
				never = true
				violated = append(violated, p.name)
				continue
			}
			var s, wait int64
			for j := len(admitted) - 1; j >= 0; j-- {
				s += int64(admitted[j].cost)
				wait = max(wait, admitted[j].at+p.t*(s+c)-p.t*p.burst-r.at)
			}
			if wait > 0 {
				violated = append(violated, p.name)
				retry = max(retry, wait)
			}
		}
		if len(violated) == 0 {
			v.avoidable++
			v.example("refusal at %d (cost %d, violated %v) had room in every policy", r.at, r.cost, r.violated)
			continue
		}
		if never {
			retry = 0
		}
		if retry != r.retry || !slices.Equal(violated, r.violated) {
			v.badRetry++
			v.example("refusal at %d: RetryAfter %dµs violated %v, model %dµs %v", r.at, r.retry, r.violated, retry, violated)
		}
	}
	if len(recs) > 0 {
		span := recs[len(recs)-1].at - recs[0].at
		for _, p := range ps {
			reach := float64(p.burst) + float64(span)/float64(p.t)
			v.reach = append(v.reach, reach)
			v.runBound = append(v.runBound, fmt.Sprintf("%s %.1f", p.name, reach))
		}
	}
	// The bound, over every interval between two admissions.
	for _, p := range ps {
		for i := range admitted {
			var s int64
			for j := i; j < len(admitted); j++ {
				s += int64(admitted[j].cost)
				span := admitted[j].at - admitted[i].at
				bound := float64(p.burst) + float64(span)/float64(p.t)
				if ratio := float64(s) / bound; ratio > v.worst {
					v.worst = ratio
				}
				if s*p.t > p.burst*p.t+span {
					v.example("policy %s: %d units admitted in [%d, %d], bound %.2f", p.name, s, admitted[i].at, admitted[j].at, bound)
				}
			}
		}
	}
	return v
}

// holds fails t unless v shows a limiter that kept its bound, refused
// nothing it had room for, and told the exact Retry-After.
func holds(t *testing.T, v verdict) {
	t.Helper()
	t.Log(v)
	if v.worst > 1 || v.avoidable > 0 || v.badRetry > 0 || v.badOrder > 0 {
		t.Errorf("the model does not hold: %v\n%s", v, strings.Join(v.examples, "\n"))
	}
}

func micro(t time.Time) int64 { return t.UnixMicro() }
