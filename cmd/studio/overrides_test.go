package main_test

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/replicaset"
)

// policyHeader is the RateLimit-Policy member of policy on r ("" when r
// has none).
func policyHeader(r *response, policy string) string {
	for _, v := range r.Header.Values("RateLimit-Policy") {
		for _, m := range strings.Split(v, ", ") {
			if strings.HasPrefix(m, `"`+policy+`";`) {
				return m
			}
		}
	}
	return ""
}

// untilOnBoth polls every replica with token's GET /api/limits/usage
// until check holds for each answer, failing after 10 s (the contract's
// second, with room for a loaded machine); it returns how long it took.
func untilOnBoth(t *testing.T, procs []*replicaset.Proc, token, what string, check func(*response) bool) time.Duration {
	t.Helper()
	start := time.Now()
	for _, p := range procs {
		for {
			r := call(t, http.MethodGet, p.URL+"/api/limits/usage", token, nil)
			if check(r) {
				break
			}
			if time.Since(start) > 10*time.Second {
				t.Fatalf("%s: not on %s after %v: %d %v %s", what, p.Name, time.Since(start), r.Status, r.Header, r.Body)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return time.Since(start)
}

// TestOverridesAcrossReplicas: an operator's override of carol's API rate
// (PUT /api/limits/overrides/api/user:carol) is in force on both replicas
// within a second (her RateLimit-Policy names it), is listed (GET
// /api/limits/overrides, the operator view, the page) and audited
// (limits.override); an override of 0 refuses her on both; its removal
// (DELETE) gives her the flag's rate back on both; a quota override
// changes her quota's q. bob, without one, keeps the flags' limits.
func TestOverridesAcrossReplicas(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-api-rate", "600/m", "-api-burst", "600", "-api-quota", "100000/day", "-token-in-flight", "100")
	const flagRate = `"api";q=600;w=60`
	untilOnBoth(t, procs, "carol-token", "the flag's rate", func(r *response) bool {
		return r.Status == http.StatusOK && policyHeader(r, "api") == flagRate
	})

	put := func(policy, key string, body any) *response {
		return call(t, http.MethodPut, procs[0].URL+"/api/limits/overrides/"+policy+"/"+key, "alice-token", body)
	}
	if r := put("api", "user:carol", map[string]any{"limit": 1200}); r.Status != http.StatusNoContent {
		t.Fatalf("PUT override: %d %s", r.Status, r.Body)
	}
	took := untilOnBoth(t, procs, "carol-token", "the override of 1200", func(r *response) bool {
		return r.Status == http.StatusOK && policyHeader(r, "api") == `"api";q=1200;w=60`
	})
	t.Logf("the override of carol's rate in force on both replicas %v after the PUT", took.Round(time.Millisecond))
	if got := policyHeader(call(t, http.MethodGet, procs[1].URL+"/api/limits/usage", "bob-token", nil), "api"); got != flagRate {
		t.Errorf("bob's rate with carol's override: %q, want %q", got, flagRate)
	}
	if r := put("quota", "user:carol", map[string]any{"limit": 5000}); r.Status != http.StatusNoContent {
		t.Fatalf("PUT quota override: %d %s", r.Status, r.Body)
	}
	untilOnBoth(t, procs, "carol-token", "the quota override of 5000", func(r *response) bool {
		return r.Status == http.StatusOK && strings.HasPrefix(policyHeader(r, "quota"), `"quota";q=5000;`)
	})

	list := call(t, http.MethodGet, procs[1].URL+"/api/limits/overrides", "alice-token", nil)
	if list.Status != http.StatusOK || !bytes.Contains(list.Body, []byte(`{"policy":"api","key":"user:carol","limit":1200}`)) ||
		!bytes.Contains(list.Body, []byte(`{"policy":"quota","key":"user:carol","limit":5000}`)) {
		t.Errorf("GET /api/limits/overrides: %d %s", list.Status, list.Body)
	}
	if view := call(t, http.MethodGet, procs[1].URL+"/api/limits", "alice-token", nil); !bytes.Contains(view.Body, []byte(`"overrides":[{"policy":"api","key":"user:carol","limit":1200}`)) {
		t.Errorf("the operator view's overrides: %.400s", view.Body)
	}
	if page := call(t, http.MethodGet, procs[0].URL+"/limits/live", "alice-token", nil); !bytes.Contains(page.Body, []byte(`<tr data-policy="api" data-key="user:carol">`)) {
		t.Errorf("the operator page does not list carol's override: %d %.300s", page.Status, page.Body)
	}

	if r := put("api", "user:carol", map[string]any{"limit": 0}); r.Status != http.StatusNoContent {
		t.Fatalf("PUT override 0: %d %s", r.Status, r.Body)
	}
	untilOnBoth(t, procs, "carol-token", "the override of 0", func(r *response) bool {
		if r.Status != http.StatusTooManyRequests || slugOf(t, r) != "too-many-requests" {
			return false
		}
		if r.Header.Get("Retry-After") != "" {
			t.Errorf("a refusal of an override of 0 has Retry-After %q: it never passes", r.Header.Get("Retry-After"))
		}
		return true
	})

	start := time.Now()
	if r := call(t, http.MethodDelete, procs[1].URL+"/api/limits/overrides/api/user:carol", "alice-token", nil); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE override: %d %s", r.Status, r.Body)
	}
	untilOnBoth(t, procs, "carol-token", "the removal", func(r *response) bool {
		return r.Status == http.StatusOK && policyHeader(r, "api") == flagRate
	})
	t.Logf("carol back to the flag's rate on both replicas %v after the DELETE", time.Since(start).Round(time.Millisecond))
	if r := call(t, http.MethodDelete, procs[0].URL+"/api/limits/overrides/api/user:carol", "alice-token", nil); r.Status != http.StatusNotFound {
		t.Errorf("a second DELETE: %d %s", r.Status, r.Body)
	}

	audit := call(t, http.MethodGet, procs[1].URL+"/api/audit?size=50", "alice-token", nil)
	if n := bytes.Count(audit.Body, []byte(`"limits.override"`)); n < 4 {
		t.Errorf("%d limits.override audit events, want 4 (three PUTs, one DELETE): %.500s", n, audit.Body)
	}
}

// TestOverridesBadInput: a non-operator may not set, remove or list
// overrides (403); an unknown policy is 404; a key that is none of the
// service's forms, and a limit that is not a whole number within the
// policy's bounds, are 400 invalid-override naming the field.
func TestOverridesBadInput(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 1, "-api-rate", "0", "-token-in-flight", "100")
	base := procs[0].URL + "/api/limits/overrides/"
	call(t, http.MethodPut, base+"api/user:bob", "carol-token", map[string]any{"limit": 1000}).problemOf(t, http.StatusForbidden, "forbidden")
	call(t, http.MethodDelete, base+"api/user:bob", "carol-token", nil).problemOf(t, http.StatusForbidden, "forbidden")
	call(t, http.MethodGet, procs[0].URL+"/api/limits/overrides", "carol-token", nil).problemOf(t, http.StatusForbidden, "forbidden")
	call(t, http.MethodPut, base+"nope/user:bob", "alice-token", map[string]any{"limit": 1}).problemOf(t, http.StatusNotFound, "unknown-policy")
	call(t, http.MethodDelete, base+"sign-in/user:bob", "alice-token", nil).problemOf(t, http.StatusNotFound, "unknown-policy")
	for _, tc := range []struct {
		path  string
		body  any
		field string
	}{
		{"api/bob", map[string]any{"limit": 1}, "key"},
		{"api/user:", map[string]any{"limit": 1}, "key"},
		{"api/token:007", map[string]any{"limit": 1}, "key"},
		{"address/address:300.1.1.1", map[string]any{"limit": 1}, "key"},
		{"api/user:" + strings.Repeat("x", 300), map[string]any{"limit": 1}, "key"},
		{"api/user:bob", map[string]any{"limit": -1}, "limit"},
		{"api/user:bob", map[string]any{"limit": 1.5}, "limit"},
		{"api/user:bob", map[string]any{"limit": "10"}, "limit"},
		{"api/user:bob", map[string]any{"limit": nil}, "limit"},
		{"api/user:bob", map[string]any{}, "limit"},
		{"api/user:bob", map[string]any{"limit": 1_000_001}, "limit"},
		{"address/address:192.0.2.1", map[string]any{"limit": 1e9}, "limit"},
		{"quota/user:bob", map[string]any{"limit": 1e17}, "limit"},
		{"quota/user:bob", map[string]any{"limit": 10, "period": "day"}, "period"},
	} {
		m := call(t, http.MethodPut, base+tc.path, "alice-token", tc.body).problemOf(t, http.StatusBadRequest, "invalid-override")
		if m["field"] != tc.field {
			t.Errorf("PUT %s %v: field %v, want %q", tc.path, tc.body, m["field"], tc.field)
		}
	}
	for _, good := range []string{"plugin-bytes/user:bob", "export-rows/user:bob", "address/address:2001:db8::%2F64", "api/token:12"} {
		if r := call(t, http.MethodPut, base+good, "alice-token", map[string]any{"limit": 1e12}); strings.HasPrefix(good, "api/") || strings.HasPrefix(good, "address/") {
			if r.Status != http.StatusBadRequest {
				t.Errorf("PUT %s limit 1e12 (above a rate's 1,000,000): %d %s", good, r.Status, r.Body)
			}
		} else if r.Status != http.StatusNoContent {
			t.Errorf("PUT %s: %d %s", good, r.Status, r.Body)
		}
	}
	if r := call(t, http.MethodPut, base+"address/address:2001:db8::%2F64", "alice-token", map[string]any{"limit": 5}); r.Status != http.StatusNoContent {
		t.Errorf("PUT an IPv6 prefix's address override: %d %s", r.Status, r.Body)
	}
	list := call(t, http.MethodGet, procs[0].URL+"/api/limits/overrides", "alice-token", nil)
	for _, want := range []string{`{"policy":"address","key":"address:2001:db8::/64","limit":5}`,
		`{"policy":"export-rows","key":"user:bob","limit":1000000000000}`, `{"policy":"plugin-bytes","key":"user:bob","limit":1000000000000}`} {
		if !bytes.Contains(list.Body, []byte(want)) {
			t.Errorf("GET /api/limits/overrides lacks %s: %s", want, list.Body)
		}
	}
}

// TestRateKeysPaged: GET /api/limits/keys/address lists the client
// addresses the address rate has counted, 100 a page with next, over two
// replicas: 150 addresses forwarded by the trusted proxy, address N
// having sent N%3+1 requests of a burst of 5, are listed once each across
// two pages, as address:ADDR with the limit and the remaining burst
// (5 - sent), and reading them consumes nothing. GET
// /api/limits/keys/api lists the users the API rate counted.
func TestRateKeysPaged(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-trusted-proxies", proxyIP+"/32", "-address-rate", "1/h", "-address-burst", "5",
		"-api-rate", "1/h", "-api-burst", "50", "-token-in-flight", "100")
	ctx := context.Background()
	sent := map[string]int{}
	for n := range 150 {
		addr := fmt.Sprintf("198.51.%d.%d", 100+n/100, n%100+1)
		sent["address:"+addr] = n%3 + 1
		for i := range n%3 + 1 {
			r, err := sendFrom(ctx, proxyIP, http.MethodGet, procs[(n+i)%2].URL+"/api/audit", addr, "", nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Status != http.StatusUnauthorized {
				t.Fatalf("%s: %d %s (want the 401 of a request without a token, counted)", addr, r.Status, r.Body)
			}
		}
	}
	for round := range 2 {
		seen := map[string]bool{}
		pages := 0
		for after := ""; ; pages++ {
			url := procs[round].URL + "/api/limits/keys/address"
			if after != "" {
				url += "?after=" + after
			}
			r := call(t, http.MethodGet, url, "alice-token", nil)
			if r.Status != http.StatusOK {
				t.Fatalf("%s: %d %s", url, r.Status, r.Body)
			}
			var page struct {
				Items []struct {
					Key       string
					Limit     int64
					Remaining int64
					Reset     time.Time
				}
				Next *string
			}
			if err := jsonUnmarshal(r.Body, &page); err != nil {
				t.Fatal(err)
			}
			if len(page.Items) > 100 {
				t.Fatalf("a page of %d keys", len(page.Items))
			}
			for _, it := range page.Items {
				want, ok := sent[it.Key]
				if !ok || seen[it.Key] || it.Limit != 1 || it.Remaining != int64(5-want) || it.Reset.IsZero() {
					t.Fatalf("round %d: %+v (sent %d, seen before %v)", round, it, want, seen[it.Key])
				}
				seen[it.Key] = true
			}
			if page.Next == nil {
				break
			}
			after = *page.Next
		}
		if len(seen) != 150 || pages != 1 {
			t.Fatalf("round %d: %d addresses over %d pages, want 150 over 2", round, len(seen), pages+1)
		}
	}
	call(t, http.MethodGet, procs[0].URL+"/api/limits/usage", "bob-token", nil)
	r := call(t, http.MethodGet, procs[1].URL+"/api/limits/keys/api", "alice-token", nil)
	if r.Status != http.StatusOK || !bytes.Contains(r.Body, []byte(`"key":"user:bob","limit":1,"remaining":49`)) {
		t.Fatalf("keys of api: %d %s", r.Status, r.Body)
	}
}
