package main_test

import (
	"bytes"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestSignInResetAcrossReplicas: carol is locked out on both replicas (the
// throttle refuses her right password); an operator clears her throttle on
// one replica (DELETE /api/limits/sign-in/carol, 204) and she signs in on
// the other long before her throttle would lapse (10 minutes): within a
// second on a quiet machine (logged); the test allows 10 s, which the
// notification takes on a loaded machine. A non-operator gets 403, a request a browser
// marks as cross-site 403 problem+json, and the reset is an audit event
// limits.reset. The operator page's button does the same.
func TestSignInResetAcrossReplicas(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-sign-in-failures", "3", "-sign-in-window", "10m")
	session := func(i int, password string) *response {
		return call(t, http.MethodPost, procs[i].URL+"/api/session", "", map[string]string{"username": "carol", "password": password})
	}
	lockOut := func() {
		t.Helper()
		for i := range 3 {
			session(i%2, "wrong").problemOf(t, http.StatusUnauthorized, "invalid-credentials")
		}
		for i := range 4 {
			session(i%2, "studio").problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")
		}
	}
	signsInWithin := func(i int, start time.Time) {
		t.Helper()
		for {
			r := session(i, "studio")
			if r.Status == http.StatusOK {
				t.Logf("carol signed in on the other replica %v after the reset", time.Since(start).Round(time.Millisecond))
				return
			}
			r.problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")
			if time.Since(start) > 10*time.Second {
				t.Fatalf("carol still refused on the other replica %v after the reset", time.Since(start))
			}
			time.Sleep(20 * time.Millisecond)
		}
	}

	lockOut()
	call(t, http.MethodDelete, procs[0].URL+"/api/limits/sign-in/carol", "bob-token", nil).problemOf(t, http.StatusForbidden, "forbidden")
	req, _ := http.NewRequest(http.MethodDelete, procs[0].URL+"/api/limits/sign-in/carol", nil)
	req.Header.Set("Authorization", "Bearer alice-token")
	req.Header.Set("Sec-Fetch-Site", "cross-site")
	crossSite := do(t, req)
	crossSite.problemOf(t, http.StatusForbidden, "cross-origin-request")
	start := time.Now()
	if r := call(t, http.MethodDelete, procs[0].URL+"/api/limits/sign-in/Carol", "alice-token", nil); r.Status != http.StatusNoContent {
		t.Fatalf("reset: %d %s", r.Status, r.Body)
	}
	signsInWithin(1, start)
	audit := call(t, http.MethodGet, procs[1].URL+"/api/audit?size=5", "alice-token", nil)
	if !bytes.Contains(audit.Body, []byte(`"limits.reset"`)) || !bytes.Contains(audit.Body, []byte(`carol`)) {
		t.Errorf("no limits.reset audit event for carol: %s", audit.Body)
	}

	// The operator page's button: a form post with the page's cookie.
	lockOut()
	form := func(site string) *response {
		req, _ := http.NewRequest(http.MethodPost, procs[1].URL+"/limits/sign-in/reset", strings.NewReader(url.Values{"username": {"carol"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Sec-Fetch-Site", site)
		req.AddCookie(&http.Cookie{Name: "studio_token", Value: "alice-token"})
		return do(t, req)
	}
	form("cross-site").problemOf(t, http.StatusForbidden, "cross-origin-request")
	start = time.Now()
	if r := form("same-origin"); r.Status != http.StatusSeeOther || !strings.HasPrefix(r.Header.Get("Location"), "/limits") {
		t.Fatalf("the page's reset: %d %q %s", r.Status, r.Header.Get("Location"), r.Body)
	}
	signsInWithin(0, start)
}

// do sends req without following redirects.
func do(t *testing.T, req *http.Request) *response {
	t.Helper()
	c := &http.Client{Timeout: time.Minute, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b.Bytes()}
}
