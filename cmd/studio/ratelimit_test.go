package main_test

import (
	"context"
	"net/http"
	"os/exec"
	"regexp"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/replicaset"
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
// (-api-rate 10/s, -api-burst 5). Judged from the answers alone: in every
// interval the admitted requests fit burst + rate × its length (measured
// from the first one's send to the last one's answer, so the bound can
// only be generous), the load reached the rate, every admitted answer
// carries RateLimit-Policy and RateLimit with the policy "api", and every
// refusal is 429 too-many-requests with limit, retryAfter and Retry-After.
func TestAPIRateAcrossReplicas(t *testing.T) {
	t.Parallel()
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

	var admitted []rateAnswer
	refused := 0
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
			refused++
			m := a.r.problemOf(t, http.StatusTooManyRequests, "too-many-requests")
			retry, _ := m["retryAfter"].(float64)
			if m["limit"] != float64(10) || retry < 1 || a.r.Header.Get("Retry-After") == "" {
				t.Errorf("refusal: %v Retry-After %q", m, a.r.Header.Get("Retry-After"))
			}
			if vs, _ := m["violated-policies"].([]any); len(vs) != 1 || vs[0] != "api" {
				t.Errorf("violated-policies %v", m["violated-policies"])
			}
		default:
			t.Errorf("%d %s", a.r.Status, a.r.Body)
		}
	}
	sort.Slice(admitted, func(i, j int) bool { return admitted[i].start.Before(admitted[j].start) })
	worst := 0.0
	for i := range admitted {
		for j := i; j < len(admitted); j++ {
			n := float64(j - i + 1)
			bound := 5 + 10*admitted[j].end.Sub(admitted[i].start).Seconds()
			worst = max(worst, n/bound)
			if n > bound {
				t.Fatalf("%v admitted between %v and %v: the bound is %.1f", n, admitted[i].start, admitted[j].end, bound)
			}
		}
	}
	first, last := answers[0].start, answers[0].end
	for _, a := range answers {
		first, last = minTime(first, a.start), maxTime(last, a.end)
	}
	reach := 5 + 10*last.Sub(first).Seconds()
	t.Logf("%d requests, %d admitted (bound over the run %.0f), %d refused; worst interval at %.2f of its bound",
		len(answers), len(admitted), reach, refused, worst)
	if refused == 0 || float64(len(admitted)) < 0.7*reach {
		t.Errorf("%d admitted of a bound of %.0f, %d refused: the load did not reach the rate", len(admitted), reach, refused)
	}
	// The sign-in route is not rate limited and carries no rate headers.
	s := call(t, http.MethodPost, procs[0].URL+"/api/session", "", map[string]string{"username": "bob", "password": "studio"})
	if s.Status != http.StatusOK || s.Header.Get("RateLimit") != "" {
		t.Errorf("sign-in: %d, RateLimit %q", s.Status, s.Header.Get("RateLimit"))
	}
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
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
		{"-api-rate", "100"}, {"-api-rate", "5/d"}, {"-api-rate", "0/s"}, {"-api-rate", "10001/s"},
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
