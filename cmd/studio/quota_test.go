package main_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"math"
	"net/http"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// periodEnd is the end of the day or month of t in loc.
func periodEnd(t time.Time, loc *time.Location, unit string) (start, end time.Time) {
	l := t.In(loc)
	if unit == "day" {
		start = time.Date(l.Year(), l.Month(), l.Day(), 0, 0, 0, 0, loc)
		return start, time.Date(l.Year(), l.Month(), l.Day()+1, 0, 0, 0, 0, loc)
	}
	start = time.Date(l.Year(), l.Month(), 1, 0, 0, 0, 0, loc)
	return start, time.Date(l.Year(), l.Month()+1, 1, 0, 0, 0, 0, loc)
}

var quotaLimitHeader = regexp.MustCompile(`^"([a-z-]+)";r=(\d+);t=(\d+)$`)

// checkQuotaHeaders checks the RateLimit-Policy and RateLimit of policy
// on r, sent at before and answered at after: q the limit, w the
// period's length, r the remaining (returned) and t the seconds to the
// period's end in loc (a second either way for rounding and clocks).
func checkQuotaHeaders(t *testing.T, r *response, policy string, limit int64, loc *time.Location, unit string, before, after time.Time) int64 {
	t.Helper()
	start, end := periodEnd(before, loc, unit)
	wantPolicy := fmt.Sprintf(`"%s";q=%d;w=%d`, policy, limit, int64(end.Sub(start).Seconds()))
	var gotPolicy, gotLimit string
	for _, v := range r.Header.Values("RateLimit-Policy") {
		if strings.HasPrefix(v, `"`+policy+`";`) {
			gotPolicy = v
		}
	}
	for _, v := range r.Header.Values("RateLimit") {
		if strings.HasPrefix(v, `"`+policy+`";`) {
			gotLimit = v
		}
	}
	if gotPolicy != wantPolicy {
		t.Errorf("RateLimit-Policy %q, want %q", r.Header.Values("RateLimit-Policy"), wantPolicy)
	}
	m := quotaLimitHeader.FindStringSubmatch(gotLimit)
	if m == nil {
		t.Fatalf("RateLimit %q has no %s", r.Header.Values("RateLimit"), policy)
	}
	remaining, _ := strconv.ParseInt(m[2], 10, 64)
	secs, _ := strconv.ParseFloat(m[3], 64)
	if lo, hi := math.Floor(end.Sub(after).Seconds())-1, math.Ceil(end.Sub(before).Seconds())+1; secs < lo || secs > hi {
		t.Errorf("RateLimit %q: t=%v, want the seconds to %s (%v..%v)", gotLimit, secs, end, lo, hi)
	}
	return remaining
}

// checkExhausted checks r is 429 quota-exhausted of policy with
// Retry-After (and retryAfter) to the period's end in loc.
func checkExhausted(t *testing.T, r *response, policy string, limit int64, loc *time.Location, unit string, before, after time.Time) {
	t.Helper()
	p := r.problemOf(t, http.StatusTooManyRequests, "quota-exhausted")
	if p["policy"] != policy || p["limit"] != float64(limit) {
		t.Errorf("refusal %v, want policy %s, limit %d", p, policy, limit)
	}
	ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
	if err != nil || p["retryAfter"] != float64(ra) {
		t.Errorf("Retry-After %q, retryAfter %v", r.Header.Get("Retry-After"), p["retryAfter"])
	}
	_, end := periodEnd(before, loc, unit)
	if lo, hi := math.Floor(end.Sub(after).Seconds())-1, math.Ceil(end.Sub(before).Seconds())+1; float64(ra) < lo || float64(ra) > hi {
		t.Errorf("Retry-After %d, want the seconds to %s (%v..%v)", ra, end, lo, hi)
	}
}

type timedResponse struct {
	r             *response
	before, after time.Time
}

func timedCall(t *testing.T, method, url, token string, body any) timedResponse {
	t.Helper()
	before := time.Now()
	r := call(t, method, url, token, body)
	return timedResponse{r, before, time.Now()}
}

// TestAPIQuotaAcrossReplicas: two replicas share a user's calendar quota
// (-api-quota) in the configured zone: a monthly one in Auckland time and
// a daily one in New York time. Bob's requests over both replicas, three
// workers at once: exactly the quota is admitted, each admitted answer
// names the period's end in the zone in its RateLimit headers, and the
// rest, on both replicas, are 429 quota-exhausted with Retry-After to the
// period's end. Bob's key keeps its state while the operator lists the
// quota's keys twice (listing consumes nothing), alice's own keys call
// being charged to her.
func TestAPIQuotaAcrossReplicas(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ quota, zone, unit string }{
		{"7/month", "Pacific/Auckland", "month"},
		{"7/day", "America/New_York", "day"},
	} {
		t.Run(tc.unit, func(t *testing.T) {
			t.Parallel()
			loc, err := time.LoadLocation(tc.zone)
			if err != nil {
				t.Fatal(err)
			}
			procs, _ := studio(t, 2, "-api-quota", tc.quota, "-quota-timezone", tc.zone, "-api-rate", "0", "-token-in-flight", "100")
			var (
				mu      sync.Mutex
				answers []timedResponse
				wg      sync.WaitGroup
			)
			for w := range 3 {
				wg.Go(func() {
					for n := range 5 {
						a := timedCall(t, http.MethodGet, procs[(w+n)%2].URL+"/api/limits/usage", "bob-token", nil)
						mu.Lock()
						answers = append(answers, a)
						mu.Unlock()
					}
				})
			}
			wg.Wait()
			admitted, refused := 0, 0
			for _, a := range answers {
				switch a.r.Status {
				case http.StatusOK:
					admitted++
					checkQuotaHeaders(t, a.r, "quota", 7, loc, tc.unit, a.before, a.after)
				case http.StatusTooManyRequests:
					refused++
					checkExhausted(t, a.r, "quota", 7, loc, tc.unit, a.before, a.after)
					checkQuotaHeaders(t, a.r, "quota", 7, loc, tc.unit, a.before, a.after)
				default:
					t.Errorf("status %d: %s", a.r.Status, a.r.Body)
				}
			}
			if admitted != 7 || refused != 8 {
				t.Fatalf("admitted %d, refused %d of 15; want 7 admitted, 8 refused", admitted, refused)
			}
			// Both replicas refuse now.
			for _, p := range procs {
				a := timedCall(t, http.MethodGet, p.URL+"/api/limits/usage", "bob-token", nil)
				checkExhausted(t, a.r, "quota", 7, loc, tc.unit, a.before, a.after)
			}
			// The operator lists the keys twice: bob's state does not move.
			var seen []map[string]any
			for _, p := range procs {
				a := timedCall(t, http.MethodGet, p.URL+"/api/limits/keys/quota", "alice-token", nil)
				if a.r.Status != http.StatusOK {
					t.Fatalf("keys: %d %s", a.r.Status, a.r.Body)
				}
				body := a.r.json(t)
				if body["next"] != nil {
					t.Errorf("next %v on a page of two keys", body["next"])
				}
				for _, it := range as[[]any](t, body["items"], "items") {
					item := as[map[string]any](t, it, "item")
					if item["key"] == "user:bob" {
						seen = append(seen, item)
					}
				}
			}
			if len(seen) != 2 || seen[0]["remaining"] != float64(0) || seen[0]["limit"] != float64(7) || fmt.Sprint(seen[0]) != fmt.Sprint(seen[1]) {
				t.Fatalf("bob's key in two listings: %v", seen)
			}
			_, end := periodEnd(time.Now(), loc, tc.unit)
			if reset, err := time.Parse(time.RFC3339, seen[0]["reset"].(string)); err != nil || !reset.Equal(end) {
				t.Errorf("reset %v, want %s", seen[0]["reset"], end)
			}
		})
	}
}

// exportRows returns the rows an export's mark line says it sent.
func exportRows(t *testing.T, r *response) int64 {
	t.Helper()
	lines := strings.Split(strings.TrimRight(string(r.Body), "\n"), "\n")
	m := regexp.MustCompile(`^#(?:complete|partial .*) rows=(\d+)$`).FindStringSubmatch(lines[len(lines)-1])
	if m == nil {
		t.Fatalf("export ends %q", lines[len(lines)-1])
	}
	n, _ := strconv.ParseInt(m[1], 10, 64)
	if int64(len(lines)-2) != n {
		t.Errorf("export of %d lines says rows=%d", len(lines), n)
	}
	return n
}

func usage(t *testing.T, base, token, user string) map[string]any {
	t.Helper()
	r := call(t, http.MethodGet, base+"/api/limits/usage?user="+user, token, nil)
	if r.Status != http.StatusOK {
		t.Fatalf("usage of %s: %d %s", user, r.Status, r.Body)
	}
	return r.json(t)
}

// TestExportRowsQuota: the audit export charges the day's rows after the
// fact, over two replicas (-export-rows-per-day 2500, row cap 1000, four
// exports of one user at once). A narrow export reserves up to the cap and
// is refunded to the rows it sent; the concurrent exports each reserve
// what is left and never send more than they reserved, so the day's total
// is never past the quota (the stated bound: 0 rows over); at exhaustion
// an export is refused before it starts, 429 quota-exhausted with
// Retry-After to the day's end in the zone; /api/limits/usage says the
// rows sent.
func TestExportRowsQuota(t *testing.T) {
	t.Parallel()
	const zone, quota = "Asia/Kolkata", 2500
	loc, _ := time.LoadLocation(zone)
	procs, _ := studio(t, 2, "-export-rows-per-day", strconv.Itoa(quota), "-export-rows", "1000", "-export-cap", "4",
		"-quota-timezone", zone, "-api-rate", "0", "-token-in-flight", "100")

	now := time.Now().UTC()
	narrow := timedCall(t, http.MethodGet, procs[0].URL+"/api/audit/export?from="+now.Add(-10*time.Second).Format(time.RFC3339)+
		"&to="+now.Add(time.Hour).Format(time.RFC3339), "bob-token", nil)
	if narrow.r.Status != http.StatusOK {
		t.Fatalf("narrow export: %d %s", narrow.r.Status, narrow.r.Body)
	}
	sent := exportRows(t, narrow.r)
	if sent >= 1000 {
		t.Fatalf("the narrow export sent %d rows", sent)
	}
	// Its headers say the reservation (the cap) was charged before it ran.
	if left := checkQuotaHeaders(t, narrow.r, "export-rows", quota, loc, "day", narrow.before, narrow.after); left != quota-1000 {
		t.Errorf("remaining after the reservation %d, want %d", left, quota-1000)
	}
	if u := usage(t, procs[1].URL, "bob-token", "bob"); u["exportRows"] != float64(sent) || u["day"] != narrow.before.In(loc).Format(time.DateOnly) {
		t.Fatalf("usage after a narrow export of %d rows: %v", sent, u)
	}

	var (
		mu      sync.Mutex
		answers []timedResponse
		wg      sync.WaitGroup
	)
	for w := range 4 {
		wg.Go(func() {
			for n := 0; ; n++ {
				a := timedCall(t, http.MethodGet, procs[(w+n)%2].URL+"/api/audit/export", "bob-token", nil)
				mu.Lock()
				answers = append(answers, a)
				mu.Unlock()
				if a.r.Status != http.StatusOK || n > 10 {
					return
				}
			}
		})
	}
	wg.Wait()
	total := sent
	refusals := 0
	for _, a := range answers {
		switch a.r.Status {
		case http.StatusOK:
			total += exportRows(t, a.r)
		case http.StatusTooManyRequests:
			refusals++
			checkExhausted(t, a.r, "export-rows", quota, loc, "day", a.before, a.after)
		default:
			t.Errorf("export: %d %s", a.r.Status, a.r.Body)
		}
	}
	t.Logf("%d exports, %d refused, %d rows sent of a quota of %d", len(answers), refusals, total, quota)
	if total != quota || refusals != 4 {
		t.Fatalf("%d rows sent, %d refusals; want exactly %d rows (never past the quota) and every worker refused at the end", total, refusals, quota)
	}
	if u := usage(t, procs[0].URL, "bob-token", "bob"); u["exportRows"] != float64(total) {
		t.Fatalf("usage %v, want exportRows %d", u, total)
	}
	// Another user has a day of their own.
	if u := usage(t, procs[0].URL, "carol-token", "carol"); u["exportRows"] != float64(0) || u["pluginBytes"] != nil {
		t.Fatalf("carol's usage %v", u)
	}
}

// TestPluginBytesQuota: plugin bytes are debited in the transaction that
// stores the plugin, over two replicas (-plugin-bytes-per-month 1000):
// each content is uploaded to both replicas at once, so exactly one
// stores it (201) and the other is 409 duplicate-plugin, charging nothing;
// a plugin past the month's bytes is 429 quota-exhausted and is not
// stored (uploading it again after is not a duplicate); the month's
// pluginBytes in /api/limits/usage equal the sum of the sizes stored.
func TestPluginBytesQuota(t *testing.T) {
	t.Parallel()
	const zone, quota = "Europe/Paris", 1000
	loc, _ := time.LoadLocation(zone)
	procs, _ := studio(t, 2, "-plugin-bytes-per-month", strconv.Itoa(quota), "-quota-timezone", zone,
		"-uploads-per-hour", "100", "-api-rate", "0", "-token-in-flight", "100")
	var stored int64
	statuses := map[int]int{}
	for i, size := range []int{300, 250, 200, 150, 120, 90} {
		content := []byte(strings.Repeat(string(rune('a'+i)), size))
		var (
			wg sync.WaitGroup
			rs [2]timedResponse
		)
		for p := range 2 {
			wg.Go(func() {
				before := time.Now()
				r := upload(t, procs[p].URL, "bob-token", fmt.Sprintf("p%d.jar", i), content)
				rs[p] = timedResponse{r, before, time.Now()}
			})
		}
		wg.Wait()
		var got []int
		for _, a := range rs {
			got = append(got, a.r.Status)
			statuses[a.r.Status]++
			switch a.r.Status {
			case http.StatusCreated:
				stored += int64(size)
				if left := checkQuotaHeaders(t, a.r, "plugin-bytes", quota, loc, "month", a.before, a.after); left != quota-stored {
					t.Errorf("remaining %d after %d stored", left, stored)
				}
			case http.StatusConflict:
				a.r.problemOf(t, http.StatusConflict, "duplicate-plugin")
			case http.StatusTooManyRequests:
				checkExhausted(t, a.r, "plugin-bytes", quota, loc, "month", a.before, a.after)
			}
		}
		t.Logf("%d bytes: %v", size, got)
		if u := usage(t, procs[i%2].URL, "bob-token", "bob"); u["pluginBytes"] != float64(stored) || u["month"] != time.Now().In(loc).Format("2006-01") {
			t.Fatalf("after %d bytes: usage %v, want pluginBytes %d", size, u, stored)
		}
	}
	// 300+250+200+150 = 900 stored; 120 more do not fit (both uploads of
	// it refused: the first rolled back, the second found no duplicate);
	// 90 do: 990.
	if stored != 990 || statuses[http.StatusCreated] != 5 || statuses[http.StatusConflict] != 5 || statuses[http.StatusTooManyRequests] != 2 {
		t.Fatalf("stored %d bytes, statuses %v; want 990 bytes in 5 plugins, 5 duplicates, the 120 bytes refused twice", stored, statuses)
	}
	// A refused plugin was not stored: it is refused again, not a duplicate.
	r := upload(t, procs[0].URL, "bob-token", "p4.jar", []byte(strings.Repeat("e", 120)))
	r.problemOf(t, http.StatusTooManyRequests, "quota-exhausted")
	// The operator reads bob's usage; the ledger lists bob.
	if u := usage(t, procs[1].URL, "alice-token", "bob"); u["pluginBytes"] != float64(990) {
		t.Fatalf("bob's usage read by an operator: %v", u)
	}
	keys := call(t, http.MethodGet, procs[0].URL+"/api/limits/keys/plugin-bytes", "alice-token", nil)
	if keys.Status != http.StatusOK || !strings.Contains(string(keys.Body), `{"key":"user:bob","limit":1000,"remaining":10,`) {
		t.Fatalf("keys: %d %s", keys.Status, keys.Body)
	}
}

// TestQuotaRoutesBadInput: who may read what, and bad input. An attacker
// with an account (carol) cannot read another user's usage nor list keys;
// an unknown policy, or one turned off, is 404; an after that is not a
// next is 400; the paging after a key lists the keys after it.
func TestQuotaRoutesBadInput(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-api-quota", "100/day", "-export-rows-per-day", "0", "-plugin-bytes-per-month", "5000", "-api-rate", "0")
	base := procs[0].URL
	for _, tok := range []string{"alice-token", "bob-token", "carol-token"} {
		call(t, http.MethodGet, base+"/api/limits/usage", tok, nil) // each user has a key now
	}
	for _, tc := range []struct {
		path, token string
		status      int
		slug        string
	}{
		{"/api/limits/usage?user=bob", "carol-token", 403, "forbidden"},
		{"/api/limits/usage?user=alice", "carol-token", 403, "forbidden"},
		{"/api/limits/usage?user=Bob", "bob-token", 403, "forbidden"},
		{"/api/limits/usage?user=", "bob-token", 400, "invalid-user"},
		{"/api/limits/usage?user=bob&user=carol", "carol-token", 400, "invalid-user"},
		{"/api/limits/usage", "", 401, "unauthorized"},
		{"/api/limits/keys/quota", "carol-token", 403, "forbidden"},
		{"/api/limits/keys/quota", "", 401, "unauthorized"},
		{"/api/limits/keys/nope", "alice-token", 404, "unknown-policy"},
		{"/api/limits/keys/api", "alice-token", 404, "unknown-policy"},
		{"/api/limits/keys/QUOTA", "alice-token", 404, "unknown-policy"},
		{"/api/limits/keys/export-rows", "alice-token", 404, "unknown-policy"}, // turned off
		{"/api/limits/keys/quota?after=", "alice-token", 400, "invalid-cursor"},
		{"/api/limits/keys/quota?after=***", "alice-token", 400, "invalid-cursor"},
		{"/api/limits/keys/quota?after=dXNlcjphbGljZQ&after=dXNlcjphbGljZQ", "alice-token", 400, "invalid-cursor"},
		{"/api/limits/keys/quota?after=" + base64.RawURLEncoding.EncodeToString([]byte{0xff, 0xfe}), "alice-token", 400, "invalid-cursor"},
		{"/api/limits/keys/quota?after=" + strings.Repeat("A", 2000), "alice-token", 400, "invalid-cursor"},
	} {
		r := call(t, http.MethodGet, base+tc.path, tc.token, nil)
		r.problemOf(t, tc.status, tc.slug)
	}
	for _, tc := range []struct{ token, user string }{{"bob-token", "bob"}, {"carol-token", "carol"}, {"alice-token", "bob"}} {
		u := usage(t, base, tc.token, tc.user)
		if u["user"] != tc.user || u["exportRows"] != nil || u["pluginBytes"] != float64(0) {
			t.Errorf("%s reads %s: %v", tc.token, tc.user, u)
		}
	}
	r := call(t, http.MethodGet, base+"/api/limits/keys/quota?after="+base64.RawURLEncoding.EncodeToString([]byte("user:bob")), "alice-token", nil)
	if r.Status != http.StatusOK {
		t.Fatalf("%d %s", r.Status, r.Body)
	}
	items := as[[]any](t, r.json(t)["items"], "items")
	if len(items) != 1 || as[map[string]any](t, items[0], "item")["key"] != "user:carol" {
		t.Fatalf("keys after user:bob: %v", items)
	}
}

// TestQuotaFlagsStartUp: the quota flags are listed, and bad values stop
// the service with a message naming the flag.
func TestQuotaFlagsStartUp(t *testing.T) {
	t.Parallel()
	bin, err := replicaset.Build("github.com/pglimit/pglimit/cmd/studio")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(bin, "-h").CombinedOutput()
	for _, want := range []string{"-api-quota value", "-quota-timezone string", "(default \"UTC\")", "-export-rows-per-day int", "-plugin-bytes-per-month int"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("-h does not say %q:\n%s", want, out)
		}
	}
	for _, args := range [][]string{
		{"-api-quota", "100"}, {"-api-quota", "100/week"}, {"-api-quota", "0/day"}, {"-api-quota", "x/month"},
		{"-quota-timezone", "Mars/Olympus_Mons"}, {"-quota-timezone", "Local"},
		{"-export-rows-per-day", "-1"}, {"-plugin-bytes-per-month", "-1"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		cmd := exec.CommandContext(ctx, bin, append([]string{"-database-url", "postgres://127.0.0.1:1/none"}, args...)...)
		out, err := cmd.CombinedOutput()
		cancel()
		if err == nil || !strings.Contains(string(out), args[0]) {
			t.Errorf("studio %v: %v %q; want an error naming %s", args, err, out, args[0])
		}
	}
}

// TestExportRowsQuotaDryRun: with -dry-run export-rows the quota refuses
// and shortens no export: with a day of 1,500 rows and a row cap of 1,000,
// every export sends its 1,000 rows; the first is charged (its
// reservation fits, settled to the rows sent), the second would pass the
// day and is counted dry-run-refused and charged nothing, and
// /api/limits/usage says the rows charged.
func TestExportRowsQuotaDryRun(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-export-rows-per-day", "1500", "-export-rows", "1000", "-dry-run", "export-rows",
		"-api-rate", "0", "-token-in-flight", "100")
	for i := range 3 {
		r := call(t, http.MethodGet, procs[i%2].URL+"/api/audit/export", "bob-token", nil)
		if r.Status != http.StatusOK {
			t.Fatalf("export %d in dry run: %d %s", i+1, r.Status, r.Body)
		}
		if n := exportRows(t, r); n != 1000 {
			t.Fatalf("export %d in dry run sent %d rows, want its cap of 1000", i+1, n)
		}
	}
	if u := usage(t, procs[1].URL, "bob-token", "bob"); u["exportRows"] != float64(1000) {
		t.Fatalf("usage after three exports in dry run %v, want exportRows 1000 (the one that fitted)", u)
	}
	m := regexp.MustCompile(`pglimit_decisions_total\{[^}]*limit="export-rows"[^}]*outcome="dry-run-refused"[^}]*\} (\d+)`).
		FindSubmatch(call(t, http.MethodGet, procs[0].URL+"/metrics", "", nil).Body)
	if m == nil || string(m[1]) == "0" {
		t.Errorf("/metrics of replica-1 counts no dry-run-refused export-rows decision")
	}
}
