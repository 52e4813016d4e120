package rules_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/rules"
)

// TestHandler: a denied address or key is 403 problem+json type ...:denied
// and never reaches next (nor Options.Keys when the address is denied
// outermost); an allowed one reaches next marked Allowed; deny wins; the
// denials are counted by scope; in dry run a denied request passes.
func TestHandler(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	ctx := context.Background()
	lists, err := access.New(ctx, pool, access.Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range []access.Rule{
		{List: access.Deny, Match: "192.0.2.0/24"},
		{List: access.Allow, Match: "198.51.100.0/24"},
		{List: access.Allow, Match: "user:alice"},
		{List: access.Deny, Match: "user:mallory"},
		{List: access.Allow, Match: "2001:db8::/48"},
	} {
		if _, err := lists.Add(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	meter := observetest.New()
	guard, err := rules.New(lists, rules.Options{
		Keys: func(r *http.Request) []string {
			if u := r.Header.Get("X-User"); u != "" {
				return []string{"user:" + u}
			}
			return nil
		},
		MeterProvider: meter,
	})
	if err != nil {
		t.Fatal(err)
	}
	reached := 0
	var allowed bool
	h := guard.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached++
		allowed = rules.Allowed(r)
		w.WriteHeader(http.StatusNoContent)
	}))
	for _, c := range []struct {
		peer, user string
		code       int
		allowed    bool
	}{
		{"192.0.2.9:4000", "", 403, false},
		{"192.0.2.9:4000", "alice", 403, false}, // deny wins
		{"[::ffff:192.0.2.9]:4000", "", 403, false},
		{"198.51.100.3:4000", "", 204, true},
		{"198.51.100.3:4000", "mallory", 403, false},
		{"203.0.113.1:4000", "", 204, false},
		{"203.0.113.1:4000", "alice", 204, true},
		{"203.0.113.1:4000", "mallory", 403, false},
		{"[2001:db8::7]:443", "", 204, true},
		{"[2001:db8:1::7]:443", "", 204, false},
		{"not-an-address", "", 204, false},
	} {
		req := httptest.NewRequest(http.MethodGet, "/api/x", nil)
		req.RemoteAddr = c.peer
		if c.user != "" {
			req.Header.Set("X-User", c.user)
		}
		rec := httptest.NewRecorder()
		before := reached
		allowed = false
		h.ServeHTTP(rec, req)
		if rec.Code != c.code {
			t.Errorf("%s %s: %d, want %d", c.peer, c.user, rec.Code, c.code)
		}
		if c.code == 403 {
			if reached != before {
				t.Errorf("%s %s: a denied request reached next", c.peer, c.user)
			}
			var body struct {
				Type   string `json:"type"`
				Status int    `json:"status"`
			}
			if ct := rec.Header().Get("Content-Type"); ct != "application/problem+json" {
				t.Errorf("%s: Content-Type %q", c.peer, ct)
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || !strings.HasSuffix(body.Type, ":denied") || body.Status != 403 {
				t.Errorf("%s: body %s (%v)", c.peer, rec.Body, err)
			}
			if rec.Header().Get("Retry-After") != "" {
				t.Errorf("%s: a denial has Retry-After", c.peer)
			}
		} else if allowed != c.allowed {
			t.Errorf("%s %s: Allowed = %v, want %v", c.peer, c.user, allowed, c.allowed)
		}
	}
	want := map[string]int64{"access refused address": 3, "access refused key": 2}
	if diff := cmp.Diff(want, meter.Decisions(t)); diff != "" {
		t.Errorf("decisions (-want +got):\n%s", diff)
	}

	// Dry run: counted and let through.
	dry, err := rules.New(lists, rules.Options{DryRun: true, MeterProvider: meter})
	if err != nil {
		t.Fatal(err)
	}
	rec := httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, "/api/x", nil)
	req.RemoteAddr = "192.0.2.1:1"
	dry.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(204) })).ServeHTTP(rec, req)
	if rec.Code != 204 || meter.Decisions(t)["access dry-run-refused address"] != 1 {
		t.Errorf("dry run: %d, decisions %v", rec.Code, meter.Decisions(t))
	}
	if _, err := rules.New(nil, rules.Options{}); err == nil {
		t.Error("New(nil) took no error")
	}
}
