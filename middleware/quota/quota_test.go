package quota_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	mquota "github.com/pglimit/pglimit/middleware/quota"
	"github.com/pglimit/pglimit/quota"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

func userHeader(r *http.Request) (string, bool) {
	u := r.Header.Get("X-User")
	return u, u != ""
}

func newPool(t *testing.T, url string) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

func newHandler(t *testing.T, pool *pgxpool.Pool, o quota.Options, served *atomic.Int64) http.Handler {
	t.Helper()
	l, err := quota.New(pool, o)
	if err != nil {
		t.Fatal(err)
	}
	m, err := mquota.New(mquota.Options{Limiter: l, Policy: "quota", Key: userHeader})
	if err != nil {
		t.Fatal(err)
	}
	return m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		served.Add(1)
		w.WriteHeader(http.StatusNoContent)
	}))
}

// Two handlers on two pools of one database (two replicas) share a daily
// quota of 20 in Auckland time: 8 workers make 40 requests, exactly 20 are
// served, the other 20 are 429 quota-exhausted with Retry-After to
// Auckland's next midnight and the members policy, limit, retryAfter; every
// answer counted names the period's end in the headers.
func TestQuotaAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	auckland, err := time.LoadLocation("Pacific/Auckland")
	if err != nil {
		t.Fatal(err)
	}
	o := quota.Options{Name: "api-day", Limit: 20, Period: quota.Day, Location: auckland}
	var served atomic.Int64
	replicas := []http.Handler{newHandler(t, newPool(t, url), o, &served), newHandler(t, newPool(t, url), o, &served)}

	var mu sync.Mutex
	statuses := map[int]int{}
	var wg sync.WaitGroup
	var next atomic.Int64
	for w := 0; w < 8; w++ {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > 40 {
					return
				}
				req := httptest.NewRequest(http.MethodGet, "/api/x", nil)
				req.Header.Set("X-User", "alice")
				rec := httptest.NewRecorder()
				before := time.Now()
				replicas[i%2].ServeHTTP(rec, req)
				after := time.Now()
				mu.Lock()
				statuses[rec.Code]++
				mu.Unlock()
				checkHeaders(t, rec, auckland, before, after)
				if rec.Code == http.StatusTooManyRequests {
					checkRefusal(t, rec, auckland, before, after)
				}
			}
		})
	}
	wg.Wait()
	if statuses[http.StatusNoContent] != 20 || statuses[http.StatusTooManyRequests] != 20 || served.Load() != 20 {
		t.Fatalf("statuses %v, served %d; want 20 served (204) and 20 refused (429)", statuses, served.Load())
	}
	// Another key has its own quota; a request without a key passes uncounted.
	for _, user := range []string{"bob", ""} {
		req := httptest.NewRequest(http.MethodGet, "/api/x", nil)
		if user != "" {
			req.Header.Set("X-User", user)
		}
		rec := httptest.NewRecorder()
		replicas[0].ServeHTTP(rec, req)
		if rec.Code != http.StatusNoContent {
			t.Errorf("user %q: status %d, want 204", user, rec.Code)
		}
		if got := rec.Header().Get("RateLimit"); (user == "") != (got == "") {
			t.Errorf("user %q: RateLimit %q", user, got)
		}
	}
}

// nextMidnight is the end of the day of t in loc.
func nextMidnight(t time.Time, loc *time.Location) time.Time {
	l := t.In(loc)
	return time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc)
}

// checkHeaders checks RateLimit-Policy and RateLimit: q the limit, w the
// day's length, t the seconds to the day's end in loc (judged against the
// local clock before and after the request, with a second either way for
// the rounding and the two clocks).
func checkHeaders(t *testing.T, rec *httptest.ResponseRecorder, loc *time.Location, before, after time.Time) {
	t.Helper()
	end := nextMidnight(before, loc)
	start := time.Date(end.Year(), end.Month(), end.Day()-1, 0, 0, 0, 0, loc)
	wantPolicy := `"quota";q=20;w=` + strconv.Itoa(int(end.Sub(start).Seconds()))
	if got := rec.Header().Get("RateLimit-Policy"); got != wantPolicy {
		t.Errorf("RateLimit-Policy %q, want %q", got, wantPolicy)
	}
	got := rec.Header().Get("RateLimit")
	rest, ok := strings.CutPrefix(got, `"quota";r=`)
	r, tt, ok2 := strings.Cut(rest, ";t=")
	if !ok || !ok2 {
		t.Fatalf("RateLimit %q", got)
	}
	remaining, _ := strconv.Atoi(r)
	secs, _ := strconv.Atoi(tt)
	if remaining < 0 || remaining > 19 {
		t.Errorf("RateLimit %q: remaining %d not in 0..19", got, remaining)
	}
	lo, hi := end.Sub(after).Seconds()-1, end.Sub(before).Seconds()+2
	if float64(secs) < lo || float64(secs) > hi {
		t.Errorf("RateLimit %q: t=%d, want the seconds to %s (%.0f..%.0f)", got, secs, end, lo, hi)
	}
}

func checkRefusal(t *testing.T, rec *httptest.ResponseRecorder, loc *time.Location, before, after time.Time) {
	t.Helper()
	var body struct {
		Type       string `json:"type"`
		Status     int    `json:"status"`
		Policy     string `json:"policy"`
		Limit      int64  `json:"limit"`
		RetryAfter int    `json:"retryAfter"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body %q: %v", rec.Body, err)
	}
	if !strings.HasSuffix(body.Type, ":quota-exhausted") || body.Status != 429 || body.Policy != "quota" || body.Limit != 20 {
		t.Errorf("refusal %+v", body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
		t.Errorf("Content-Type %q", ct)
	}
	ra, err := strconv.Atoi(rec.Header().Get("Retry-After"))
	if err != nil || ra != body.RetryAfter {
		t.Errorf("Retry-After %q, retryAfter %d", rec.Header().Get("Retry-After"), body.RetryAfter)
	}
	end := nextMidnight(before, loc)
	if lo, hi := end.Sub(after).Seconds()-1, end.Sub(before).Seconds()+2; float64(ra) < lo || float64(ra) > hi {
		t.Errorf("Retry-After %d, want the seconds to %s", ra, end)
	}
}

// A database that cannot decide is 503 with Retry-After, never 500 and
// never a pass.
func TestUnavailable(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgtest.URL(t))
	var served atomic.Int64
	h := newHandler(t, pool, quota.Options{Name: "gone", Limit: 5, Period: quota.Month, Timeout: 2 * time.Second}, &served)
	pool.Close()
	req := httptest.NewRequest(http.MethodGet, "/api/x", nil)
	req.Header.Set("X-User", "alice")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != http.StatusServiceUnavailable || rec.Header().Get("Retry-After") == "" || served.Load() != 0 {
		t.Fatalf("status %d, Retry-After %q, served %d; want 503 with Retry-After, nothing served", rec.Code, rec.Header().Get("Retry-After"), served.Load())
	}
	if !strings.Contains(rec.Body.String(), "database-unavailable") {
		t.Errorf("body %s", rec.Body)
	}
}

// A cost above the limit never fits: 429 without Retry-After.
func TestCostAboveLimit(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgtest.URL(t))
	l, err := quota.New(pool, quota.Options{Name: "big", Limit: 5, Period: quota.Month})
	if err != nil {
		t.Fatal(err)
	}
	m, err := mquota.New(mquota.Options{Limiter: l, Policy: "bytes", Key: userHeader, Cost: func(*http.Request) int64 { return 6 }})
	if err != nil {
		t.Fatal(err)
	}
	h := m.Handler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { t.Error("served") }))
	req := httptest.NewRequest(http.MethodGet, "/", nil)
	req.Header.Set("X-User", "alice")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	if rec.Code != 429 || rec.Header().Get("Retry-After") != "" || !strings.Contains(rec.Body.String(), `"policy":"bytes"`) {
		t.Fatalf("status %d, Retry-After %q, body %s", rec.Code, rec.Header().Get("Retry-After"), rec.Body)
	}
}

func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool := newPool(t, pgtest.URL(t))
	l, err := quota.New(pool, quota.Options{Name: "o", Limit: 5, Period: quota.Day})
	if err != nil {
		t.Fatal(err)
	}
	for name, o := range map[string]mquota.Options{
		"no limiter":     {Policy: "quota", Key: userHeader},
		"no key":         {Limiter: l, Policy: "quota"},
		"no policy":      {Limiter: l, Key: userHeader},
		"policy quoted":  {Limiter: l, Policy: `a"b`, Key: userHeader},
		"policy upper":   {Limiter: l, Policy: "Quota", Key: userHeader},
		"policy too big": {Limiter: l, Policy: strings.Repeat("a", 65), Key: userHeader},
	} {
		if _, err := mquota.New(o); err == nil {
			t.Errorf("%s: New accepted %+v", name, o)
		}
	}
}
