package main_test

import (
	"bytes"
	"context"
	"fmt"
	"mime/multipart"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestSignInThrottleAcrossReplicas: five failed sign-ins from one client
// address spread over three replicas use up alice's allowance from it (the
// pair: -sign-in-failures); the sixth attempt, even with the right
// password, is 429 too-many-failed-sign-ins, scope pair. An unknown
// username is throttled exactly alike. bob is untouched and signs in.
func TestSignInThrottleAcrossReplicas(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 3, "-sign-in-failures", "5", "-sign-in-window", "10m")
	session := func(i int, user, password string) *response {
		return call(t, http.MethodPost, procs[i%3].URL+"/api/session", "", map[string]string{"username": user, "password": password})
	}
	for _, user := range []string{"alice", "nobody-at-all"} {
		for i := 0; i < 5; i++ {
			session(i, user, "wrong").problemOf(t, http.StatusUnauthorized, "invalid-credentials")
		}
		for i, password := range []string{"wrong", "studio"} {
			r := session(i, user, password)
			m := r.problemOf(t, http.StatusTooManyRequests, "too-many-failed-sign-ins")
			ra, err := strconv.Atoi(r.Header.Get("Retry-After"))
			if err != nil || ra < 590 || ra > 600 {
				t.Errorf("%s: Retry-After %q, want about 600", user, r.Header.Get("Retry-After"))
			}
			if m["limit"] != float64(5) || m["retryAfter"] != float64(ra) || m["scope"] != "pair" {
				t.Errorf("%s: members limit %v retryAfter %v scope %v", user, m["limit"], m["retryAfter"], m["scope"])
			}
		}
	}
	r := session(0, "bob", "studio")
	if r.Status != http.StatusOK {
		t.Fatalf("bob: %d %s", r.Status, r.Body)
	}
	token, _ := r.json(t)["token"].(string)
	if token == "" {
		t.Fatal("no token")
	}
	if r := call(t, http.MethodGet, procs[1].URL+"/api/events?size=1", token, nil); r.Status != http.StatusOK {
		t.Fatalf("the issued token on another replica: %d", r.Status)
	}
	// bob is no operator: the operator view is not his.
	call(t, http.MethodGet, procs[1].URL+"/api/limits", token, nil).problemOf(t, http.StatusForbidden, "forbidden")
	// The operator view lists alice's throttle (alice is an operator).
	r = call(t, http.MethodGet, procs[2].URL+"/api/limits", "alice-token", nil)
	if !bytes.Contains(r.Body, []byte(`"key":"pair:alice|address:127.0.0.1"`)) {
		t.Fatalf("operator view without alice's throttle: %s", r.Body)
	}
}

func upload(t *testing.T, base, token, name string, content []byte) *response {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	fw, _ := mw.CreateFormFile("file", name)
	fw.Write(content)
	mw.Close()
	req, _ := http.NewRequest(http.MethodPost, base+"/api/plugins", &body)
	req.Header.Set("Content-Type", mw.FormDataContentType())
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b.Bytes()}
}

// TestUploadWindowAcrossReplicas: two uploads per hour for carol, wherever
// they land; a rejected (empty) file does not count; the third is 429
// too-many-uploads with Retry-After of about an hour.
func TestUploadWindowAcrossReplicas(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 3, "-uploads-per-hour", "2")
	if r := upload(t, procs[0].URL, "carol-token", "empty.jar", nil); r.Status != http.StatusBadRequest {
		t.Fatalf("empty plugin: %d %s", r.Status, r.Body)
	}
	for i := 0; i < 2; i++ {
		r := upload(t, procs[i].URL, "carol-token", fmt.Sprintf("p%d.jar", i), fmt.Appendf(nil, "plugin bytes %d", i)) // another content each: a content stored already is 409
		if r.Status != http.StatusCreated {
			t.Fatalf("upload %d: %d %s", i, r.Status, r.Body)
		}
		m := r.json(t)
		if sum, _ := m["sha256"].(string); len(sum) != 64 {
			t.Fatalf("upload answer %v", m)
		}
	}
	r := upload(t, procs[2].URL, "carol-token", "p3.jar", []byte("plugin bytes 3"))
	m := r.problemOf(t, http.StatusTooManyRequests, "too-many-uploads")
	ra, _ := strconv.Atoi(r.Header.Get("Retry-After"))
	if ra < 3590 || ra > 3600 || m["limit"] != float64(2) || m["retryAfter"] != float64(ra) {
		t.Fatalf("refusal: Retry-After %d, members %v", ra, m)
	}
	// alice has her own allowance.
	if r := upload(t, procs[2].URL, "alice-token", "a.jar", []byte("x")); r.Status != http.StatusCreated {
		t.Fatalf("alice: %d", r.Status)
	}
}

// TestHousekeepingRemovesLapsedRows: an upload's slot lapses when its window
// ends, and the service's housekeeping deletes the row soon after.
func TestHousekeepingRemovesLapsedRows(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 2, "-upload-window", "1s", "-housekeeping", "300ms")
	if r := upload(t, procs[0].URL, "bob-token", "b.jar", []byte("x")); r.Status != http.StatusCreated {
		t.Fatalf("upload: %d %s", r.Status, r.Body)
	}
	pool := pgtest.Pool(t, dbURL, 1)
	count := func() int {
		var n int
		// The table itself: the view upload_window shows live slots only.
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.slot WHERE kind = 'upload_window'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if n := count(); n != 1 {
		t.Fatalf("%d upload_window rows after an upload, want 1", n)
	}
	deadline := time.Now().Add(10 * time.Second)
	for count() != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the lapsed upload_window row was never removed")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
