package upload_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/harness/wait"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/internal/respond"
	"github.com/pglimit/pglimit/middleware/upload"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

func userHeader(r *http.Request) (string, bool) {
	u := r.Header.Get("X-User")
	return u, u != ""
}

// plugins is the upload handler the tests wrap: body "bad" is a rejected
// file (400), "panic" panics, "slow" waits for the client to go away, and
// anything else is stored (201).
type plugins struct {
	stored atomic.Int64
	// onStored, when set, runs in the handler of each stored upload.
	onStored func(r *http.Request)
}

func (p *plugins) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return // the client went away mid-upload; nothing to answer
	}
	switch string(body) {
	case "bad":
		respond.BadRequest(w, "invalid-plugin", "Invalid plugin", "The file is not a plugin.")
		return
	case "panic":
		panic("plugin parser crashed")
	case "slow":
		<-r.Context().Done()
		return
	case "500":
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	if p.onStored != nil {
		p.onStored(r)
	}
	p.stored.Add(1)
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	_, _ = io.WriteString(w, `{"id":"p1"}`)
}

func newLimiter(t testing.TB, pool *pgxpool.Pool, opts upload.Options) *upload.Limiter {
	t.Helper()
	if opts.Key == nil {
		opts.Key = userHeader
	}
	l, err := upload.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	// Runs before the pool's own cleanup: no release is on its way when
	// the pool closes.
	t.Cleanup(func() { _ = l.Flush(context.Background()) })
	return l
}

type response struct {
	status int
	header http.Header
	body   map[string]any
}

func send(t testing.TB, h http.Handler, user, body string) response {
	t.Helper()
	req := httptest.NewRequest(http.MethodPost, "/api/plugins", strings.NewReader(body))
	if user != "" {
		req.Header.Set("X-User", user)
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return decode(t, rec.Result())
}

func decode(t testing.TB, res *http.Response) response {
	t.Helper()
	defer res.Body.Close()
	raw, _ := io.ReadAll(res.Body)
	r := response{status: res.StatusCode, header: res.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			t.Fatalf("body %q: %v", raw, err)
		}
	}
	return r
}

func wantRefusal(limit int, window string, retry int) map[string]any {
	return map[string]any{
		"type":   "urn:pglimit:problem:too-many-uploads",
		"title":  "Too many uploads",
		"status": float64(429),
		"detail": fmt.Sprintf("You made %d uploads in the last %s, your limit; the oldest of them leaves the window in %d seconds.",
			limit, window, retry),
		"instance":   "/api/plugins",
		"limit":      float64(limit),
		"retryAfter": float64(retry),
	}
}

// checkRefusal compares a refusal field by field; Retry-After must agree
// with retryAfter and be at most maxRetry.
func checkRefusal(t *testing.T, got response, limit int, window string, maxRetry int) int {
	t.Helper()
	if got.status != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429; body %v", got.status, got.body)
	}
	retry, err := strconv.Atoi(got.header.Get("Retry-After"))
	if err != nil || retry < 1 || retry > maxRetry {
		t.Fatalf("Retry-After %q, want 1..%d", got.header.Get("Retry-After"), maxRetry)
	}
	if diff := cmp.Diff(wantRefusal(limit, window, retry), got.body); diff != "" {
		t.Errorf("refusal body (-want +got):\n%s", diff)
	}
	return retry
}

func liveSlots(t testing.TB, pool *pgxpool.Pool, user string) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pglimit.upload_window WHERE scope = $1 AND expires_at > now()`, upload.Scope(user)).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLimitHoldsAcrossReplicas: 40 concurrent uploads of one user through
// three replicas (three pools): exactly 5 are stored, 35 refused, and the
// table (read by a separate connection) holds 5 slots.
func TestLimitHoldsAcrossReplicas(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	p := &plugins{}
	var servers []*httptest.Server
	for i := 0; i < 3; i++ {
		pool := pgtest.Pool(t, url, 8)
		srv := httptest.NewServer(newLimiter(t, pool, upload.Options{Replica: fmt.Sprint("r", i)}).Handler(p))
		t.Cleanup(srv.Close)
		servers = append(servers, srv)
	}
	const n = 40
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		statuses = map[int]int{}
		refusals []response
		start    = make(chan struct{})
	)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, servers[i%3].URL+"/api/plugins", strings.NewReader("plugin"))
			req.Header.Set("X-User", "alice")
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			got := decode(t, res)
			mu.Lock()
			defer mu.Unlock()
			statuses[got.status]++
			if got.status == http.StatusTooManyRequests {
				refusals = append(refusals, got)
			}
		}()
	}
	close(start)
	wg.Wait()
	if diff := cmp.Diff(map[int]int{201: 5, 429: n - 5}, statuses); diff != "" {
		t.Fatalf("statuses (-want +got):\n%s", diff)
	}
	if s := p.stored.Load(); s != 5 {
		t.Fatalf("%d uploads stored, want 5", s)
	}
	for _, r := range refusals {
		checkRefusal(t, r, 5, "hour", 3600)
	}
	observer := pgtest.Pool(t, url, 1)
	if got := liveSlots(t, observer, "alice"); got != 5 {
		t.Fatalf("upload_window holds %d live slots of alice, want 5", got)
	}
}

// TestRollingWindowBoundary: 5 per window. After 5 uploads the sixth is
// refused until the first leaves the window, on the database clock, and is
// accepted right after; the seventh is refused while the second is still
// in it. The uploads are a window/8 apart; a machine too slow to send the
// five and the sixth within the window (the first had left it, by the
// database's clock, when the sixth was answered 201) is judged again with
// a window twice as long, up to 16 s, for a fresh user.
func TestRollingWindowBoundary(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	ctx := context.Background()
	// claimedAt is when, on the database clock, user's nth oldest upload
	// still stored was claimed; since how long ago a time of the database
	// clock was.
	claimedAt := func(user string, nth int) (claimed time.Time) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT claimed_at FROM pglimit.upload_window
			WHERE scope = $1 ORDER BY claimed_at OFFSET $2 LIMIT 1`, upload.Scope(user), nth-1).Scan(&claimed); err != nil {
			t.Fatal(err)
		}
		return claimed
	}
	since := func(at time.Time) (ago time.Duration) {
		t.Helper()
		if err := pool.QueryRow(ctx, `SELECT now() - $1::timestamptz`, at).Scan(&ago); err != nil {
			t.Fatal(err)
		}
		return ago
	}
	for window := 2 * time.Second; ; window *= 2 {
		if window > 16*time.Second {
			t.Fatal("the machine could not send six uploads within a window of 16 s")
		}
		user := fmt.Sprintf("bob-%v", window)
		words := fmt.Sprintf("%d seconds", window/time.Second)
		maxRetry := int(window / time.Second)
		h := newLimiter(t, pool, upload.Options{Limit: 5, Window: window}).Handler(&plugins{})
		for i := 0; i < 5; i++ {
			if got := send(t, h, user, "plugin"); got.status != http.StatusCreated {
				t.Fatalf("upload %d: %d", i+1, got.status)
			}
			time.Sleep(window / 8)
		}
		first, second := claimedAt(user, 1), claimedAt(user, 2)
		got := send(t, h, user, "plugin")
		if got.status == http.StatusCreated {
			if since(first) >= window {
				t.Logf("window %v: the sixth upload came after the first had left the window: again with a longer one", window)
				continue
			}
		}
		checkRefusal(t, got, 5, words, maxRetry)
		for refusals := 0; ; refusals++ {
			got := send(t, h, user, "plugin")
			if got.status == http.StatusCreated {
				break
			}
			checkRefusal(t, got, 5, words, maxRetry)
			if refusals > 100+int(window/(20*time.Millisecond)) {
				t.Fatal("the sixth upload was never accepted")
			}
			time.Sleep(20 * time.Millisecond)
		}
		var sixth time.Time
		if err := pool.QueryRow(ctx, `SELECT max(claimed_at) FROM pglimit.upload_window WHERE scope = $1`, upload.Scope(user)).Scan(&sixth); err != nil {
			t.Fatal(err)
		}
		if gap := sixth.Sub(first); gap < window {
			t.Fatalf("the sixth upload was claimed %v after the first, inside the window of %v", gap, window)
		} else if gap > window+time.Second {
			t.Fatalf("the sixth upload waited %v, far beyond the window of %v", gap, window)
		}
		// The second oldest is still in the window (a window/8 younger
		// than the first): the seventh is refused, unless the machine took
		// that long to send it.
		got = send(t, h, user, "plugin")
		if got.status == http.StatusCreated {
			if since(second) >= window {
				t.Logf("window %v: the seventh upload came after the second had left the window: again with a longer one", window)
				continue
			}
		}
		checkRefusal(t, got, 5, words, maxRetry)
		return
	}
}

// TestRollingBoundUnderLoad hammers one user's uploads from three replicas
// for three windows and records every stored upload's claimed_at from the
// table itself (the database clock): no window-length interval ever holds
// more than the limit, and the limit is reached in some.
func TestRollingBoundUnderLoad(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	const (
		limit  = 5
		window = time.Second
	)
	observer := pgtest.Pool(t, url, 4)
	var (
		mu      sync.Mutex
		claimed = map[uuid.UUID]time.Time{}
	)
	p := &plugins{onStored: func(r *http.Request) {
		// This upload's own row is live now: collect every live row.
		rows, err := observer.Query(r.Context(), `SELECT lease_id, claimed_at FROM pglimit.upload_window WHERE scope = $1 AND expires_at > now()`, upload.Scope("carol"))
		if err != nil {
			t.Error(err)
			return
		}
		defer rows.Close()
		for rows.Next() {
			var id uuid.UUID
			var at time.Time
			if err := rows.Scan(&id, &at); err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			claimed[id] = at
			mu.Unlock()
		}
	}}
	var handlers []http.Handler
	for i := 0; i < 3; i++ {
		pool := pgtest.Pool(t, url, 4)
		handlers = append(handlers, newLimiter(t, pool, upload.Options{Limit: limit, Window: window}).Handler(p))
	}
	deadline := time.Now().Add(3*window + 300*time.Millisecond)
	var wg sync.WaitGroup
	var refused atomic.Int64
	for c := 0; c < 6; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(deadline) {
				got := send(t, handlers[c%3], "carol", "plugin")
				switch got.status {
				case http.StatusCreated:
				case http.StatusTooManyRequests:
					refused.Add(1)
				default:
					t.Errorf("status %d", got.status)
				}
				time.Sleep(10 * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	stored := int(p.stored.Load())
	times := make([]time.Time, 0, len(claimed))
	for _, at := range claimed {
		times = append(times, at)
	}
	sort.Slice(times, func(i, j int) bool { return times[i].Before(times[j]) })
	t.Logf("%d uploads stored over %v, %d refused", stored, 3*window, refused.Load())
	if len(times) != stored {
		t.Fatalf("observed %d claims for %d stored uploads", len(times), stored)
	}
	if stored < 3*limit {
		t.Fatalf("only %d uploads in three windows: the window never rolled", stored)
	}
	for i := 0; i+limit < len(times); i++ {
		if gap := times[i+limit].Sub(times[i]); gap < window {
			t.Fatalf("%d uploads within %v (%v .. %v), limit %d per %v", limit+1, gap, times[i], times[i+limit], limit, window)
		}
	}
	full := false
	for i := 0; i+limit-1 < len(times); i++ {
		if times[i+limit-1].Sub(times[i]) < window {
			full = true
		}
	}
	if !full {
		t.Fatal("no window ever held the limit: the test proves nothing")
	}
}

// TestUploadsThatDoNotCount: rejected files (400), server errors, panics
// and clients that go away give their slot back; the allowance is intact.
func TestUploadsThatDoNotCount(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewDB(t, 4)
	p := &plugins{}
	l := newLimiter(t, pool, upload.Options{Limit: 2})
	h := l.Handler(p)
	for i := 0; i < 5; i++ {
		if got := send(t, h, "dave", "bad"); got.status != http.StatusBadRequest {
			t.Fatalf("bad file: %d", got.status)
		}
		if got := send(t, h, "dave", "500"); got.status != http.StatusInternalServerError {
			t.Fatalf("server error: %d", got.status)
		}
		func() {
			defer func() {
				if recover() == nil {
					t.Fatal("the handler's panic was swallowed")
				}
			}()
			send(t, h, "dave", "panic")
		}()
	}
	// The give-backs left as the handler ended; Flush waits for them.
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := liveSlots(t, pool, "dave"); n != 0 {
		t.Fatalf("%d slots held after uploads that did not count", n)
	}

	// Reading the upload fails (the client's connection broke) and the
	// handler returns without a word, before the server noticed.
	req := httptest.NewRequest(http.MethodPost, "/api/plugins", io.MultiReader(strings.NewReader("plu"), errReader{}))
	req.Header.Set("X-User", "dave")
	h.ServeHTTP(httptest.NewRecorder(), req)
	if err := l.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := liveSlots(t, pool, "dave"); n != 0 {
		t.Fatalf("%d slots held after an upload whose body could not be read", n)
	}

	// Clients that go away: mid-body, and while the handler works.
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, mode := range []string{"mid-body", "while handled"} {
		ctx, cancel := context.WithCancel(context.Background())
		pr, pw := io.Pipe()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/api/plugins", pr)
		req.Header.Set("X-User", "dave")
		done := make(chan struct{})
		go func() {
			defer close(done)
			res, err := http.DefaultClient.Do(req)
			if err == nil {
				res.Body.Close()
			}
		}()
		if mode == "mid-body" {
			_, _ = pw.Write([]byte("plu"))
		} else {
			_, _ = pw.Write([]byte("slow"))
			pw.Close()
		}
		observer := pgtest.Pool(t, url, 1)
		wait.For(t, 10*time.Second, "the upload to claim its slot", func() bool { return liveSlots(t, observer, "dave") == 1 })
		cancel()
		pw.CloseWithError(errors.New("client gone"))
		<-done
		wait.For(t, 10*time.Second, mode+": the slot to be given back", func() bool { return liveSlots(t, observer, "dave") == 0 })
	}

	for i := 0; i < 2; i++ {
		if got := send(t, h, "dave", "plugin"); got.status != http.StatusCreated {
			t.Fatalf("good upload %d after the failures: %d", i+1, got.status)
		}
	}
	checkRefusal(t, send(t, h, "dave", "plugin"), 2, "hour", 3600)
	if n := liveSlots(t, pool, "dave"); n != 2 {
		t.Fatalf("%d slots, want 2", n)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrUnexpectedEOF }

// TestCountsOption replaces the status rule.
func TestCountsOption(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	h := newLimiter(t, pool, upload.Options{Limit: 1, Counts: func(int) bool { return true }}).Handler(&plugins{})
	send(t, h, "erin", "bad")
	checkRefusal(t, send(t, h, "erin", "plugin"), 1, "hour", 3600)
}

// TestUnidentifiedPassesUncounted: a request without a user reaches the
// upload handler and counts against nobody, even for a user whose window
// is full.
func TestUnidentifiedPassesUncounted(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	p := &plugins{}
	h := newLimiter(t, pool, upload.Options{Limit: 1}).Handler(p)
	if got := send(t, h, "gina", "plugin"); got.status != http.StatusCreated {
		t.Fatalf("first upload: %d", got.status)
	}
	for i := range 3 {
		if got := send(t, h, "", "plugin"); got.status != http.StatusCreated {
			t.Fatalf("unidentified upload %d: %d %v, want it passed to the handler", i, got.status, got.body)
		}
	}
	if p.stored.Load() != 4 {
		t.Errorf("%d uploads stored, want 4", p.stored.Load())
	}
	var n int
	if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pglimit.upload_window`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d slots in upload_window, want gina's 1 (unidentified uploads uncounted)", n)
	}
}

// TestBadOptions are refused by New, each with an error naming what is
// wrong; the defaults of a good set are applied.
func TestBadOptions(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	for _, tc := range []struct {
		name string
		opts upload.Options
		want string
	}{
		{"no key", upload.Options{}, "Key"},
		{"negative limit", upload.Options{Key: userHeader, Limit: -1}, "Limit"},
		{"limit above MaxLimit", upload.Options{Key: userHeader, Limit: pglimit.MaxLimit + 1}, "Limit"},
		{"negative window", upload.Options{Key: userHeader, Window: -time.Second}, "Window"},
		{"tiny window", upload.Options{Key: userHeader, Window: time.Nanosecond}, "Window"},
		{"window without bound", upload.Options{Key: userHeader, Window: math.MaxInt64}, "Window"},
		{"negative timeout", upload.Options{Key: userHeader, Timeout: -time.Second}, "Timeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := upload.New(pool, tc.opts); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("New = %v, want an error naming %s", err, tc.want)
			}
		})
	}
	if _, err := upload.New(nil, upload.Options{Key: userHeader}); err == nil {
		t.Error("New accepted a nil pool")
	}
	l := newLimiter(t, pool, upload.Options{})
	if l.Limit() != 5 || l.Window() != time.Hour || l.Name() != "uploads" {
		t.Errorf("defaults %d %v %q", l.Limit(), l.Window(), l.Name())
	}
	if _, err := upload.New(pool, upload.Options{Key: userHeader, Limit: pglimit.MaxLimit}); err != nil {
		t.Errorf("New at MaxLimit: %v", err)
	}
}

// TestOnErrorWritesEveryResponse: a refusal and a database that cannot be
// reached both go through OnError.
func TestOnErrorWritesEveryResponse(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewDB(t, 2)
	var got []error
	onError := func(w http.ResponseWriter, r *http.Request, err error) {
		got = append(got, err)
		w.WriteHeader(http.StatusTeapot)
	}
	h := newLimiter(t, pool, upload.Options{Limit: 1, OnError: onError}).Handler(&plugins{})
	send(t, h, "hana", "plugin")
	if res := send(t, h, "hana", "plugin"); res.status != http.StatusTeapot || len(got) != 1 || !errors.Is(got[0], pglimit.ErrLimited) {
		t.Fatalf("refusal: %d, OnError got %v", res.status, got)
	}
	closed := pgtest.Pool(t, url, 1)
	closed.Close()
	down := newLimiter(t, closed, upload.Options{OnError: onError, Logger: slog.New(slog.DiscardHandler)})
	if res := send(t, down.Handler(&plugins{}), "hana", "plugin"); res.status != http.StatusTeapot || len(got) != 2 ||
		pglimit.Classify(got[1]) != pglimit.ClassUnavailable {
		t.Fatalf("database closed: %d, OnError got %v", res.status, got)
	}
	rec := httptest.NewRecorder()
	upload.WriteError(rec, httptest.NewRequest(http.MethodPost, "/", nil), got[1])
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "database-unavailable") {
		t.Errorf("WriteError of a closed pool: %d %s", rec.Code, rec.Body)
	}
}

// TestAcquireAPI: the non-HTTP Acquire and Release.
func TestAcquireAPI(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 2)
	l := newLimiter(t, pool, upload.Options{Limit: 1})
	ctx := context.Background()
	p, err := l.Acquire(ctx, "frank")
	if err != nil {
		t.Fatal(err)
	}
	_, err = l.Acquire(ctx, "frank")
	var le *limit.Refusal
	if !errors.Is(err, pglimit.ErrLimited) || !errors.As(err, &le) {
		t.Fatalf("second acquire: %v", err)
	}
	if le.Limit != 1 || le.Window != time.Hour || le.RetryAfter < 59*time.Minute || le.RetryAfter > time.Hour || le.Name != "uploads" {
		t.Fatalf("refusal %+v", le)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatalf("second release: %v", err)
	}
	if _, err := l.Acquire(ctx, "frank"); err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if _, err := l.Acquire(ctx, ""); err == nil {
		t.Fatal("acquire for an empty key")
	}
}

func TestFormatWindow(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]string{
		time.Hour: "hour", 2 * time.Hour: "2 hours", 90 * time.Minute: "90 minutes", time.Minute: "minute",
		2 * time.Second: "2 seconds", 1500 * time.Millisecond: "1.5s",
	} {
		if got := upload.FormatWindow(d); got != want {
			t.Errorf("FormatWindow(%v) = %q, want %q", d, got, want)
		}
	}
}
