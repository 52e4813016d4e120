package app

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestEveryResetIsAudited: every reset an operator asks for leaves its
// limits.reset audit event — of a username with failures, of one that had
// none (failures 0), through the API and the page's form, and of one the
// database could not do in time (the test holds a lock on the throttle
// table past the request's bound: 503, and the event says failed, with the
// reason). A refused request (not an operator: 403; no username: 400) is no
// reset and leaves none.
func TestEveryResetIsAudited(t *testing.T) {
	t.Parallel()
	a, dbURL := testApp(t)
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	obs := pgtest.Pool(t, dbURL, 2)
	ctx := context.Background()
	type event struct {
		Actor, Username, Reason string
		Failures                int
		Failed                  bool
	}
	events := func() (got []event) {
		rows, err := obs.Query(ctx, `SELECT actor, detail->>'username', coalesce(detail->>'reason', ''), (detail->>'failures')::int,
			coalesce((detail->>'failed')::bool, false) FROM audit_event WHERE action = 'limits.reset' ORDER BY id`)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		for rows.Next() {
			var e event
			if err := rows.Scan(&e.Actor, &e.Username, &e.Reason, &e.Failures, &e.Failed); err != nil {
				t.Fatal(err)
			}
			got = append(got, e)
		}
		if err := rows.Err(); err != nil {
			t.Fatal(err)
		}
		return got
	}
	expect := func(what string, want ...event) {
		t.Helper()
		got := events()
		if len(got) != len(want) {
			t.Fatalf("%s: limits.reset events %+v, want %+v", what, got, want)
		}
		for i := range want {
			if got[i] != want[i] {
				t.Fatalf("%s: limits.reset event %d %+v, want %+v", what, i, got[i], want[i])
			}
		}
	}
	for range 2 {
		if status, body := postBody(t, srv, http.MethodPost, "/api/session", "", "application/json", `{"username":"carol","password":"wrong"}`); status != 401 {
			t.Fatalf("carol's wrong password: %d %s", status, body)
		}
	}
	del := func(token, name string) int {
		status, _ := postBody(t, srv, http.MethodDelete, "/api/limits/sign-in/"+name, token, "", "")
		return status
	}
	if s := del("bob-token", "carol"); s != http.StatusForbidden {
		t.Fatalf("bob's reset: %d", s)
	}
	if s := del("alice-token", "%20"); s != http.StatusBadRequest {
		t.Fatalf("reset of a blank username: %d", s)
	}
	expect("refused resets")
	if s := del("alice-token", "Carol"); s != http.StatusNoContent {
		t.Fatalf("reset of carol: %d", s)
	}
	want := []event{{Actor: "alice", Username: "carol", Failures: 2}}
	expect("reset of carol", want...)
	if s := del("alice-token", "nobody"); s != http.StatusNoContent {
		t.Fatalf("reset of nobody: %d", s)
	}
	want = append(want, event{Actor: "alice", Username: "nobody"})
	expect("reset of a username without failures", want...)

	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/limits/sign-in/reset", strings.NewReader(url.Values{"username": {"dave"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	req.AddCookie(&http.Cookie{Name: tokenCookie, Value: "alice-token"})
	c := srv.Client()
	c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("the page's reset of dave: %d", resp.StatusCode)
	}
	want = append(want, event{Actor: "alice", Username: "dave"})
	expect("the page's reset", want...)

	// The database cannot do the reset within the request's bound.
	tx, err := obs.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	if _, err := tx.Exec(ctx, `LOCK TABLE pglimit.login_attempt IN ACCESS EXCLUSIVE MODE`); err != nil {
		t.Fatal(err)
	}
	status, body := postBody(t, srv, http.MethodDelete, "/api/limits/sign-in/erin", "alice-token", "", "")
	_ = tx.Rollback(ctx)
	if status != http.StatusServiceUnavailable {
		t.Fatalf("reset while the table is locked: %d %s", status, body)
	}
	want = append(want, event{Actor: "alice", Username: "erin", Failed: true, Reason: "database-unavailable"})
	expect("a reset the database could not do", want...)
}
