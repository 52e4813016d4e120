package problem

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// TestWrite pins the body and headers of a refusal: the standard members,
// the extensions at the top level (never overriding a standard member),
// Retry-After in whole seconds rounded up, and the extra headers.
func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Write(rec, &Details{
		Slug: "too-many-uploads", Title: "Too many uploads", Status: http.StatusTooManyRequests,
		Detail: "five an hour", Instance: "/api/plugins", RetryAfter: 1500 * time.Millisecond,
		Extensions: map[string]any{"limit": 5, "retryAfter": 2, "status": 200, "type": "x"},
		Header:     http.Header{"Ratelimit-Policy": {`"uploads";q=5;w=3600`}},
	})
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", rec.Code)
	}
	for h, want := range map[string]string{
		"Content-Type": "application/problem+json", "Retry-After": "2", "Cache-Control": "no-store",
		"Ratelimit-Policy": `"uploads";q=5;w=3600`,
	} {
		if got := rec.Header().Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type": "urn:pglimit:problem:too-many-uploads", "title": "Too many uploads", "status": float64(429),
		"detail": "five an hour", "instance": "/api/plugins", "limit": float64(5), "retryAfter": float64(2),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(rec.Body.String(), `{"type":`) {
		t.Errorf("the type member is not first: %s", rec.Body.String())
	}
}

// TestWriteKeepsOuterRateLimitFields: a refusal's RateLimit fields are
// added beside those an outer limit set before the handler ran (the
// fields are lists; their lines join into one).
func TestWriteKeepsOuterRateLimitFields(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	rec.Header().Set("RateLimit-Policy", `"api";q=100;w=1`)
	rec.Header().Set("RateLimit", `"api";r=99;t=1`)
	Write(rec, &Details{Slug: "too-many-heavy-requests", Title: "Too many", Status: http.StatusTooManyRequests,
		Header: http.Header{
			"Ratelimit-Policy": {`"sql-console";q=2;qu="concurrent-requests"`},
			"Ratelimit":        {`"sql-console";r=0;t=17`},
		}})
	for h, want := range map[string][]string{
		"RateLimit-Policy": {`"api";q=100;w=1`, `"sql-console";q=2;qu="concurrent-requests"`},
		"RateLimit":        {`"api";r=99;t=1`, `"sql-console";r=0;t=17`},
	} {
		if got := rec.Header().Values(h); !cmp.Equal(got, want) {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
}

// TestInternal: a server error carries its status and slug, no
// Retry-After (a retry cannot be promised to succeed), and no error text.
func TestInternal(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	rec := httptest.NewRecorder()
	Internal(rec, req)
	if rec.Code != http.StatusInternalServerError || !strings.Contains(rec.Body.String(), TypeBase+"internal-error") || rec.Header().Get("Retry-After") != "" {
		t.Errorf("Internal: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}
