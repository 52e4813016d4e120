package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestReadOnlyPrimaryIs503: a primary demoted in a failover answers every
// write with SQLSTATE 25006 (read-only transaction) until the service finds
// the new one. Here the service's database is made read-only for every new
// session (default_transaction_read_only) and the replica's pool opens
// fresh connections: every route whose limit must write to decide answers
// 503 problem+json with Retry-After — the database cannot decide now —
// never a 500.
func TestReadOnlyPrimaryIs503(t *testing.T) {
	t.Parallel()
	a, url := testApp(t)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	obs := pgtest.Pool(t, url, 1)
	ctx := context.Background()
	// ALTER DATABASE takes no parameter for the name: built with format().
	if _, err := obs.Exec(ctx, `DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_read_only = on', current_database()); END $$`); err != nil {
		t.Fatal(err)
	}
	a.primary.Reset() // the pool's next connections are read-only sessions

	for _, tc := range []struct {
		method, path, token, body, slug string
	}{
		{http.MethodPost, "/api/session", "", `{"username":"alice","password":"studio"}`, "sign-in-unavailable"},
		{http.MethodGet, "/api/limits", "alice-token", "", ""},
		{http.MethodGet, "/api/audit?size=1", "bob-token", "", ""},
		{http.MethodPost, "/api/sql", "alice-token", `{"sql":"SELECT 1"}`, ""},
		{http.MethodDelete, "/api/limits/sign-in/carol", "alice-token", "", ""},
	} {
		req, _ := http.NewRequest(tc.method, srv.URL+tc.path, strings.NewReader(tc.body))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var p struct {
			Type   string `json:"type"`
			Status int    `json:"status"`
		}
		_ = json.Unmarshal(body, &p)
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
			resp.Header.Get("Content-Type") != "application/problem+json" || p.Status != http.StatusServiceUnavailable {
			t.Errorf("%s %s on a read-only primary: %d Retry-After %q: %s; want 503 problem+json with Retry-After",
				tc.method, tc.path, resp.StatusCode, resp.Header.Get("Retry-After"), body)
			continue
		}
		if tc.slug != "" && !strings.HasSuffix(p.Type, tc.slug) {
			t.Errorf("%s %s: type %q, want %s", tc.method, tc.path, p.Type, tc.slug)
		}
		if strings.Contains(string(body), "read-only") || strings.Contains(string(body), "25006") {
			t.Errorf("%s %s: the answer carries the database's text: %s", tc.method, tc.path, body)
		}
	}
}
