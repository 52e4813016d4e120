package pglimit_test

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
)

// TestInflightAroundTheMuxWithSignIn is the README's composition: the
// in-flight cap wraps the whole mux, the sign-in throttle only the sign-in
// route. A sign-in carries no token, so it passes the in-flight cap
// uncounted and reaches its throttle: wrong passwords are 401 until the
// limit, then 429 too-many-failed-sign-ins — never a 401 from the cap.
// Requests with a token are counted by the cap.
func TestInflightAroundTheMuxWithSignIn(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(t), 4)
	throttle, err := signin.New(pool, signin.Options{Limit: 2})
	if err != nil {
		t.Fatal(err)
	}
	capper, err := inflight.New(pool, inflight.Options{
		Key: func(r *http.Request) (string, bool) {
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			return "id-of-" + token, ok && token != ""
		},
		Limit: 1,
	})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	started := make(chan struct{})
	mux := http.NewServeMux()
	mux.Handle("POST /login", throttle.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := signin.FromContext(r.Context()); !ok {
			http.Error(w, "a username is required", http.StatusBadRequest)
			return
		}
		var req struct{ Username, Password string }
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Password != "right" {
			http.Error(w, "invalid credentials", http.StatusUnauthorized)
			return
		}
		_, _ = w.Write([]byte(`{"token":"t1"}`))
	})))
	mux.HandleFunc("GET /api/report", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("hold") != "" {
			close(started)
			<-release
		}
	})
	srv := httptest.NewServer(capper.Handler(mux))
	defer srv.Close()

	login := func(password string) int {
		resp, err := http.Post(srv.URL+"/login", "application/json", strings.NewReader(`{"username":"alice","password":"`+password+`"}`))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var got []int
	for range 3 {
		got = append(got, login("wrong"))
	}
	if want := []int{401, 401, 429}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] {
		t.Fatalf("sign-ins through the in-flight cap answered %v, want %v (throttled, not refused by the cap)", got, want)
	}
	var failures int
	if err := pool.QueryRow(t.Context(), `SELECT failures FROM pglimit.login_attempt WHERE key = 'username:alice'`).Scan(&failures); err != nil || failures != 2 {
		t.Fatalf("login_attempt for alice: %d failures, %v; want 2", failures, err)
	}

	get := func(path string) int {
		req, _ := http.NewRequest(http.MethodGet, srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer t1")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	held := make(chan int, 1)
	go func() { held <- get("/api/report?hold=1") }()
	<-started
	if code := get("/api/report"); code != http.StatusTooManyRequests {
		t.Errorf("a second request of the token while one is in flight: %d, want 429", code)
	}
	close(release)
	if code := <-held; code != http.StatusOK {
		t.Errorf("the held request: %d", code)
	}
}
