package app

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// postBody sends body to srv's path with Content-Type type and an optional
// bearer token, and returns the status and the body of the answer.
func postBody(t *testing.T, srv *httptest.Server, method, path, token, ctype, body string) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, srv.URL+path, strings.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// TestMalformedSignInWritesNothing: a sign-in body handleSession would
// refuse is refused by the throttle before anything is written, so nobody
// can fill the throttle table (pglimit.login_attempt) without a password
// being checked — neither the username's nor the client address's. The
// observer counts the table's rows in the test's own database after each
// request. A well-formed wrong password, the control, is 401 and two rows
// (its username's and its address's).
func TestMalformedSignInWritesNothing(t *testing.T) {
	t.Parallel()
	// Every request comes from one address: the address rate (which counts
	// malformed sign-ins too, TestAddressKeys) is off so that the 200 below
	// reach the throttle.
	a, url := testApp(t, "-address-rate", "0")
	srv := httptest.NewServer(a.Handler())
	defer srv.Close()
	obs := pgtest.Pool(t, url, 1)
	rows := func() (n int) {
		if err := obs.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.login_attempt`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	const invalid, tooLarge = "invalid-sign-in-request", "sign-in-request-too-large"
	for _, tc := range []struct {
		name, ctype, body string
		status            int
		slug              string
	}{
		{"unknown member", "application/json", `{"username":"u1","x":1}`, 400, invalid},
		{"unknown member beside a password", "application/json", `{"username":"u2","password":"p","admin":true}`, 400, invalid},
		{"missing password", "application/json", `{"username":"u3"}`, 400, invalid},
		{"null password", "application/json", `{"username":"u4","password":null}`, 400, invalid},
		{"password not a string", "application/json", `{"username":"u5","password":12345}`, 400, invalid},
		{"username not a string", "application/json", `{"username":["u6"],"password":"p"}`, 400, invalid},
		{"trailing object", "application/json", `{"username":"u7","password":"p"}{"x":1}`, 400, invalid},
		{"trailing garbage", "application/json", `{"username":"u8","password":"p"} x`, 400, invalid},
		{"two documents", "application/json", `{"username":"u9","password":"p"}` + "\n" + `{"username":"u9","password":"q"}`, 400, invalid},
		{"truncated", "application/json", `{"username":"u10","password":"p"`, 400, invalid},
		{"invalid UTF-8", "application/json", "{\"username\":\"u11\xff\",\"password\":\"p\"}", 400, invalid},
		{"array", "application/json", `[{"username":"u12","password":"p"}]`, 400, invalid},
		{"form body", "application/x-www-form-urlencoded", `username=u13&password=p`, 400, invalid},
		{"empty username", "application/json", `{"username":"  ","password":"p"}`, 400, invalid},
		{"empty body", "application/json", ``, 400, invalid},
		{"oversize", "application/json", `{"username":"u14","password":"` + strings.Repeat("x", 5000) + `"}`, 413, tooLarge},
		{"form label, JSON with unknown member", "application/x-www-form-urlencoded", `{"username":"u15","x":1}`, 400, invalid},
	} {
		status, body := postBody(t, srv, http.MethodPost, "/api/session", "", tc.ctype, tc.body)
		var p struct{ Type string }
		_ = json.Unmarshal(body, &p)
		if status != tc.status || !strings.HasSuffix(p.Type, ":"+tc.slug) {
			t.Errorf("%s: %d %s, want %d %s", tc.name, status, body, tc.status, tc.slug)
		}
		if n := rows(); n != 0 {
			t.Fatalf("%s: %d throttle rows written for a malformed sign-in", tc.name, n)
		}
	}
	// The report of issue 27: 200 sign-ins with an unknown member.
	for i := range 200 {
		if status, body := postBody(t, srv, http.MethodPost, "/api/session", "", "application/json", fmt.Sprintf(`{"username":"u%d","x":1}`, i)); status != 400 {
			t.Fatalf("sign-in %d with an unknown member: %d %s", i, status, body)
		}
	}
	if n := rows(); n != 0 {
		t.Fatalf("%d throttle rows after 200 malformed sign-ins, want 0", n)
	}
	if status, body := postBody(t, srv, http.MethodPost, "/api/session", "", "application/json", `{"username":"mallory","password":"wrong"}`); status != 401 {
		t.Fatalf("a wrong password: %d %s", status, body)
	}
	if n := rows(); n != 3 {
		t.Fatalf("a wrong password left %d throttle rows, want 3 (its pair's, its address's and its username's)", n)
	}
	if status, body := postBody(t, srv, http.MethodPost, "/api/session", "", "application/json", `{"username":"alice","password":"studio"}`); status != 200 {
		t.Fatalf("alice's sign-in: %d %s", status, body)
	}
}
