package main_test

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"os/exec"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// rateAnswer is one request of the rate test as the client saw it.
type rateAnswer struct {
	start, end time.Time
	r          *response
}

var (
	apiPolicyHeader = regexp.MustCompile(`^"api";q=10;w=1;pglimit-burst=5$`)
	apiLimitHeader  = regexp.MustCompile(`^"api";r=(\d+);t=(\d+)$`)
)

// TestAPIRateAcrossReplicas: three replicas share one token's rate
// (-api-rate 10/s, -api-burst 5). Judged from the answers alone, each
// request placed in the window from its send to its answer, in which the
// service decided it; a slow answer only widens a window, so load can only
// loosen the judgement, never fail a correct limiter:
//
//   - no over-grant: for every set of admitted requests, the span from the
//     first send to the last answer among them admits at most
//     burst + rate × its length;
//   - no false refusal: a refusal is false when the requests that may have
//     been admitted before it (sent before its answer) fit burst + rate ×
//     every interval ending at its send, with room for one more;
//   - the load reached the rate (some refusals), every admitted answer
//     carries RateLimit-Policy and RateLimit with the policy "api", and
//     every refusal is 429 too-many-requests with limit, retryAfter and
//     Retry-After.
func TestAPIRateAcrossReplicas(t *testing.T) {
	t.Parallel()
	const (
		rate  = 10.0 // per second
		burst = 5
	)
	procs, _ := studio(t, 3, "-api-rate", "10/s", "-api-burst", "5", "-token-in-flight", "100")
	var (
		mu      sync.Mutex
		answers []rateAnswer
		wg      sync.WaitGroup
	)
	stop := time.Now().Add(3 * time.Second)
	for i := range 6 {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				start := time.Now()
				r, err := send(context.Background(), http.MethodGet, procs[(i+n)%3].URL+"/api/limits", "alice-token", nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answers = append(answers, rateAnswer{start: start, end: time.Now(), r: r})
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	var admitted, refusals []rateAnswer
	for _, a := range answers {
		switch a.r.Status {
		case http.StatusOK:
			admitted = append(admitted, a)
			if p := a.r.Header.Get("RateLimit-Policy"); !apiPolicyHeader.MatchString(p) {
				t.Errorf("RateLimit-Policy %q", p)
			}
			if l := a.r.Header.Get("RateLimit"); !apiLimitHeader.MatchString(l) {
				t.Errorf("RateLimit %q", l)
			}
		case http.StatusTooManyRequests:
			refusals = append(refusals, a)
			m := a.r.problemOf(t, http.StatusTooManyRequests, "too-many-requests")
			retry, _ := m["retryAfter"].(float64)
			if m["limit"] != float64(10) || retry < 1 || a.r.Header.Get("Retry-After") == "" {
				t.Errorf("refusal: %v Retry-After %q", m, a.r.Header.Get("Retry-After"))
			}
			if m["scope"] != "user" {
				t.Errorf("refusal scope %v, want user", m["scope"])
			}
			if vs, _ := m["violated-policies"].([]any); len(vs) != 1 || vs[0] != "api" {
				t.Errorf("violated-policies %v", m["violated-policies"])
			}
		default:
			t.Errorf("%d %s", a.r.Status, a.r.Body)
		}
	}
	excess, where := rateExcess(admitted, rate)
	falseRefused := falseRateRefusals(admitted, refusals, rate, burst)
	t.Logf("%d requests, %d admitted, %d refused (%d false); most admitted beyond the rate in one interval: %.2f (burst %d)%s",
		len(answers), len(admitted), len(refusals), falseRefused, excess, burst, where)
	if excess > burst {
		t.Errorf("over-grant: %.2f admitted beyond the rate in one interval, more than the burst of %d%s", excess, burst, where)
	}
	if falseRefused > 0 {
		t.Errorf("%d of %d refusals came while the token had room for the request", falseRefused, len(refusals))
	}
	if len(refusals) == 0 || len(admitted) <= burst {
		t.Errorf("%d admitted, %d refused: the load did not reach the rate", len(admitted), len(refusals))
	}
	// The sign-in route is not in the token's rate: it carries the
	// client address's rate headers (policy "address"), not "api".
	s := call(t, http.MethodPost, procs[0].URL+"/api/session", "", map[string]string{"username": "bob", "password": "studio"})
	if s.Status != http.StatusOK || !strings.HasPrefix(s.Header.Get("RateLimit"), `"address";`) {
		t.Errorf("sign-in: %d, RateLimit %q", s.Status, s.Header.Get("RateLimit"))
	}
}

// rateExcess is the most requests admitted in one interval beyond
// rate × its length, over every interval between two admitted requests,
// from the first one's send to the last answer of the requests sent
// between them (all of which the service decided within it). With GCRA it
// is at most the burst; latency lengthens the intervals, so it can only
// lower the excess. where names the highest.
func rateExcess(admitted []rateAnswer, perSecond float64) (excess float64, where string) {
	admitted = slices.Clone(admitted)
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].start.Before(admitted[j].start) })
	for i, first := range admitted {
		last := first.end
		for j := i; j < len(admitted); j++ {
			last = maxTime(last, admitted[j].end)
			if e := float64(j-i+1) - perSecond*last.Sub(first.start).Seconds(); e > excess {
				excess = e
				where = fmt.Sprintf("; highest: %d admitted in %v", j-i+1, last.Sub(first.start).Round(time.Millisecond))
			}
		}
	}
	return excess, where
}

// falseRateRefusals counts the refusals the answers prove false. GCRA
// refuses a request at t only if, for some u <= t, the requests admitted in
// [u, t] and this one exceed burst + perSecond × (t - u). A refusal R was
// decided at some t at or after its send, so counting as admitted in
// [u, t] every admitted request that may have been (sent before R's answer,
// answered after u), and taking t = R's send (the least allowance), a
// refusal that still fits for every u was false. The rule can miss a false
// refusal, never invent one.
func falseRateRefusals(admitted, refusals []rateAnswer, perSecond float64, burst int) (n int) {
	for _, r := range refusals {
		var ends []time.Time // the holders' last possible decision times
		for _, h := range admitted {
			if h.start.Before(r.end) {
				ends = append(ends, h.end)
			}
		}
		sort.Slice(ends, func(i, j int) bool { return ends[i].Before(ends[j]) })
		fits, later := true, 0
		for k, e := range ends {
			if e.After(r.start) {
				later++
				continue
			}
			// u just before e: the holders answered from e on, and r.
			if float64(len(ends)-k+1) > float64(burst)+perSecond*r.start.Sub(e).Seconds() {
				fits = false
			}
		}
		// u = r's send: the holders answered after it, and r.
		if fits && later+1 <= burst {
			n++
		}
	}
	return n
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// TestAPIRateOff: -api-rate 0 turns the rate limit off: no headers, no
// refusal however fast a token goes.
func TestAPIRateOff(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-api-rate", "0", "-api-burst", "1", "-token-in-flight", "100")
	for range 20 {
		r := call(t, http.MethodGet, procs[0].URL+"/api/audit?size=1", "carol-token", nil)
		if r.Status != http.StatusOK || r.Header.Get("RateLimit-Policy") != "" {
			t.Fatalf("%d RateLimit-Policy %q", r.Status, r.Header.Get("RateLimit-Policy"))
		}
	}
}

// TestAPIRateFlags: the rate flags are listed and bad values stop the
// service with a message.
func TestAPIRateFlags(t *testing.T) {
	t.Parallel()
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, want := range []string{"-api-rate value", "-api-burst int", "(default 100/s)", "(default 200)"} {
		if !regexp.MustCompile(regexp.QuoteMeta(want)).Match(out) {
			t.Errorf("-h does not say %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{
		{"-api-rate", "100"}, {"-api-rate", "5/d"}, {"-api-rate", "0/s"}, {"-api-rate", "1000001/s"},
		{"-api-rate", "x/s"}, {"-api-burst", "0"}, {"-api-burst", "10001"},
	} {
		cmd := exec.Command(bin, args...)
		cmd.Env = envWithout("DATABASE_URL")
		out, err := cmd.CombinedOutput()
		if err == nil || len(out) == 0 {
			t.Errorf("studio %v: %v %q; want an error that says why", args, err, out)
		}
	}
}

// TestAPIRatePerUser: the API rate is the user's, every token of the user
// together (REFERENCE-SERVICE.md, -api-rate): alice signs in three more
// times and spends her four tokens at once over two replicas (-api-rate
// 10/s, -api-burst 5). Judged from the answers alone as in
// TestAPIRateAcrossReplicas, her admitted requests over all her tokens
// together never exceed burst + rate × the interval; a rate kept per token
// admits about four times that.
func TestAPIRatePerUser(t *testing.T) {
	t.Parallel()
	const (
		rate  = 10.0 // per second
		burst = 5
	)
	procs, _ := studio(t, 2, "-api-rate", "10/s", "-api-burst", "5", "-token-in-flight", "100")
	tokens := []string{"alice-token"}
	for i := range 3 {
		r := call(t, http.MethodPost, procs[i%2].URL+"/api/session", "", map[string]string{"username": "alice", "password": "studio"})
		if r.Status != http.StatusOK {
			t.Fatalf("sign-in: %d %s", r.Status, r.Body)
		}
		tokens = append(tokens, as[string](t, r.json(t)["token"], "token"))
	}
	var (
		mu      sync.Mutex
		answers []rateAnswer
		perTok  = map[string]int{}
		wg      sync.WaitGroup
	)
	stop := time.Now().Add(3 * time.Second)
	for i := range 8 {
		token := tokens[i%len(tokens)]
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				start := time.Now()
				r, err := send(context.Background(), http.MethodGet, procs[(i+n)%2].URL+"/api/limits", token, nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answers = append(answers, rateAnswer{start: start, end: time.Now(), r: r})
				if r.Status == http.StatusOK {
					perTok[token]++
				}
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()

	var admitted, refusals []rateAnswer
	for _, a := range answers {
		switch a.r.Status {
		case http.StatusOK:
			admitted = append(admitted, a)
		case http.StatusTooManyRequests:
			a.r.problemOf(t, http.StatusTooManyRequests, "too-many-requests")
			refusals = append(refusals, a)
		default:
			t.Errorf("%d %s", a.r.Status, a.r.Body)
		}
	}
	excess, where := rateExcess(admitted, rate)
	falseRefused := falseRateRefusals(admitted, refusals, rate, burst)
	t.Logf("%d requests over %d tokens, %d admitted (per token %v), %d refused (%d false); most admitted beyond the rate in one interval: %.2f (burst %d)%s",
		len(answers), len(tokens), len(admitted), slices.Collect(maps.Values(perTok)), len(refusals), falseRefused, excess, burst, where)
	if excess > burst {
		t.Errorf("over-grant: %.2f admitted beyond the user's rate in one interval over all her tokens, more than the burst of %d%s", excess, burst, where)
	}
	if falseRefused > 0 {
		t.Errorf("%d of %d refusals came while the user had room for the request", falseRefused, len(refusals))
	}
	if len(refusals) == 0 || len(admitted) <= burst {
		t.Errorf("%d admitted, %d refused: the load did not reach the rate", len(admitted), len(refusals))
	}
}
