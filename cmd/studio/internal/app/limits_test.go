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

// TestLimitsListsAreBounded: with 250 live throttles and 130 requests in
// flight (rows written by the test), GET /api/limits lists at most listMax
// of each, the latest to lapse first, and counts them all in totals; the
// operator page still renders and says how many it left out.
func TestLimitsListsAreBounded(t *testing.T) {
	t.Parallel()
	a, url := testApp(t)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	obs := pgtest.Pool(t, url, 1)
	ctx := context.Background()
	if _, err := obs.Exec(ctx, `INSERT INTO pglimit.login_attempt (key, failures, first_at, last_at, expires_at)
		SELECT 'username:flood' || g, 1, now(), now(), now() + interval '1 hour' + interval '1 second' * g FROM generate_series(1, 250) AS g`); err != nil {
		t.Fatal(err)
	}
	if _, err := obs.Exec(ctx, `INSERT INTO pglimit.slot (kind, scope, slot, holder, endpoint, replica, claimed_at, expires_at, lease_id)
		SELECT 'request_in_flight', 'token:' || g, 1, g::text, 'GET /api/x', 'r', now(), now() + interval '1 hour', gen_random_uuid()
		FROM generate_series(1, 130) AS g`); err != nil {
		t.Fatal(err)
	}
	status, body := postBody(t, srv, http.MethodGet, "/api/limits", "alice-token", "", "")
	if status != http.StatusOK {
		t.Fatalf("GET /api/limits: %d %s", status, body)
	}
	var got struct {
		Throttles []throttleRow `json:"throttles"`
		InFlight  []limitRow    `json:"inFlight"`
		ListMax   int           `json:"listMax"`
		Totals    listTotals    `json:"totals"`
	}
	if err := json.Unmarshal(body, &got); err != nil {
		t.Fatal(err)
	}
	if got.ListMax != listMax || len(got.Throttles) != listMax || got.Totals.Throttles != 250 {
		t.Errorf("throttles: %d listed of %d (listMax %d), want %d of 250", len(got.Throttles), got.Totals.Throttles, got.ListMax, listMax)
	}
	if len(got.Throttles) > 0 && got.Throttles[0].Key != "username:flood250" {
		t.Errorf("first throttle %q, want the latest to lapse, username:flood250", got.Throttles[0].Key)
	}
	// alice's own request is in flight too.
	if len(got.InFlight) != listMax || got.Totals.InFlight < 130 || got.Totals.InFlight > 131 {
		t.Errorf("in flight: %d listed of %d, want %d of 130 or 131", len(got.InFlight), got.Totals.InFlight, listMax)
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/limits", nil)
	req.AddCookie(&http.Cookie{Name: tokenCookie, Value: "alice-token"})
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(page), `id="throttles-more">And 150 more`) ||
		strings.Count(string(page), `data-key="username:flood`) != listMax {
		t.Errorf("GET /limits: %d, %d throttle rows, want %d and 150 more:\n%.2000s", resp.StatusCode,
			strings.Count(string(page), `data-key="username:flood`), listMax, page)
	}
}
