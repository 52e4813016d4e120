package main_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The loopback addresses these tests dial from: 127.0.0.1 is a client,
// 127.0.0.2 the stand-in proxy the replicas trust (-trusted-proxies
// 127.0.0.2/32).
const (
	clientIP = "127.0.0.1"
	proxyIP  = "127.0.0.2"
)

var (
	clientsMu sync.Mutex
	clients   = map[string]*http.Client{}
)

// clientFrom is an HTTP client whose connections leave from the loopback
// address local.
func clientFrom(local string) *http.Client {
	clientsMu.Lock()
	defer clientsMu.Unlock()
	if c := clients[local]; c != nil {
		return c
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	c := &http.Client{Timeout: 2 * time.Minute, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 16}}
	clients[local] = c
	return c
}

// sendFrom sends a request from the loopback address local, with the
// given X-Forwarded-For ("" none) and token ("" none).
func sendFrom(ctx context.Context, local, method, url, xff, token string, body []byte) (*response, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return nil, err
	}
	if xff != "" {
		req.Header.Set("X-Forwarded-For", xff)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := clientFrom(local).Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	return &response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

var addressPolicyHeader = regexp.MustCompile(`^"address";q=1;w=3600;pglimit-burst=3$`)

// TestAddressKeys: two replicas on one database, trusting 127.0.0.2 as
// their proxy, each client address allowed a burst of 3 requests without
// a token (-address-rate 1/h, so nothing refills while the test runs and
// every count is exact):
//
//   - from an untrusted peer (127.0.0.1) every forwarded address is
//     ignored: a fresh X-Forwarded-For on each request changes no key, so
//     the fourth request is refused, 429 too-many-requests with scope
//     address, whatever it claims;
//   - through the trusted proxy each forwarded address is its own key;
//   - addresses rotating inside one IPv6 /64, forwarded by the proxy, are
//     one client; the next /64 is another;
//   - the proxy's own requests (no X-Forwarded-For) are its key; one whose
//     header names no client is 400 client-address-unreadable;
//   - every answer to a request without a token carries RateLimit-Policy
//     and RateLimit of policy "address"; POST /api/session is counted
//     too; a request with a token is not (its refusal is scope user).
func TestAddressKeys(t *testing.T) {
	t.Parallel()
	procs, _ := studio(t, 2, "-trusted-proxies", proxyIP+"/32", "-address-rate", "1/h", "-address-burst", "3",
		"-api-rate", "1/h", "-api-burst", "1")
	ctx := context.Background()
	n := 0
	// anon sends a request without a token, alternating the replicas and
	// the route (GET /api/limits answers 401, POST /api/session 401 for a
	// wrong password).
	anon := func(local, xff string) *response {
		t.Helper()
		n++
		base := procs[n%2].URL
		var r *response
		var err error
		if n%3 == 0 {
			r, err = sendFrom(ctx, local, http.MethodPost, base+"/api/session", xff, "", []byte(`{"username":"nobody-`+strconv.Itoa(n)+`","password":"x"}`))
		} else {
			r, err = sendFrom(ctx, local, http.MethodGet, base+"/api/limits", xff, "", nil)
		}
		if err != nil {
			t.Fatal(err)
		}
		if p := r.Header.Get("RateLimit-Policy"); !addressPolicyHeader.MatchString(p) {
			t.Errorf("%s as %q: RateLimit-Policy %q", local, xff, p)
		}
		if l := r.Header.Get("RateLimit"); !strings.HasPrefix(l, `"address";r=`) {
			t.Errorf("%s as %q: RateLimit %q", local, xff, l)
		}
		return r
	}
	admitted := func(r *response) bool {
		t.Helper()
		switch r.Status {
		case http.StatusUnauthorized: // unauthorized, or invalid-credentials for the sign-in
			return true
		case http.StatusTooManyRequests:
			m := r.problemOf(t, http.StatusTooManyRequests, "too-many-requests")
			if m["scope"] != "address" || m["limit"] != float64(1) || r.Header.Get("Retry-After") == "" {
				t.Errorf("address refusal: %v, Retry-After %q", m, r.Header.Get("Retry-After"))
			}
			return false
		}
		t.Fatalf("%d %s", r.Status, r.Body)
		return false
	}
	// expect sends one request per xff from local and checks which were
	// admitted.
	expect := func(what, local string, xffs []string, want []bool) {
		t.Helper()
		var got []bool
		for _, x := range xffs {
			got = append(got, admitted(anon(local, x)))
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: admitted %v, want %v", what, got, want)
		}
	}
	yes, no := true, false

	expect("untrusted peer, a new forwarded address each time", clientIP,
		[]string{"", "198.51.100.1", "198.51.100.2", "198.51.100.3", "2001:db8::1", ""}, []bool{yes, yes, yes, no, no, no})
	expect("trusted proxy, one forwarded client", proxyIP,
		[]string{"198.51.100.1", "198.51.100.1", "198.51.100.1", "198.51.100.1"}, []bool{yes, yes, yes, no})
	expect("trusted proxy, other forwarded clients", proxyIP,
		[]string{"198.51.100.2", "198.51.100.3", "203.0.113.9, 198.51.100.4"}, []bool{yes, yes, yes})
	expect("trusted proxy, the client forwarded behind the proxy's own hop", proxyIP,
		[]string{"198.51.100.1, 127.0.0.2"}, []bool{no})
	var rotating []string
	for i := range 6 {
		rotating = append(rotating, fmt.Sprintf("2001:db8:1:2:%x:%x::%x", (i*7919)&0xffff, (i*104729)&0xffff, i+1))
	}
	expect("trusted proxy, one IPv6 /64 rotating", proxyIP, rotating, []bool{yes, yes, yes, no, no, no})
	expect("trusted proxy, the next /64", proxyIP, []string{"2001:db8:1:3::1"}, []bool{yes})
	expect("trusted proxy, nothing forwarded: the proxy's own key", proxyIP,
		[]string{"", "", ""}, []bool{yes, yes, yes})
	// A header from the proxy that names no client is refused and counted
	// nowhere (not as the proxy, whose burst is spent already: still 400).
	if r, err := sendFrom(ctx, proxyIP, http.MethodGet, procs[0].URL+"/api/limits", "unknown", "", nil); err != nil {
		t.Fatal(err)
	} else {
		r.problemOf(t, http.StatusBadRequest, "client-address-unreadable")
	}
	expect("trusted proxy, nothing forwarded, past its burst", proxyIP, []string{""}, []bool{no})

	// With a token, the address's rate is not spent: 127.0.0.1's is, yet
	// alice passes, once (-api-burst 1); her second is the user rate's
	// refusal.
	r, err := sendFrom(ctx, clientIP, http.MethodGet, procs[0].URL+"/api/limits", "", "alice-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != http.StatusOK || !strings.HasPrefix(r.Header.Get("RateLimit-Policy"), `"api";`) {
		t.Errorf("alice from a spent address: %d RateLimit-Policy %q", r.Status, r.Header.Get("RateLimit-Policy"))
	}
	r, err = sendFrom(ctx, clientIP, http.MethodGet, procs[1].URL+"/api/limits", "", "alice-token", nil)
	if err != nil {
		t.Fatal(err)
	}
	if m := r.problemOf(t, http.StatusTooManyRequests, "too-many-requests"); m["scope"] != "user" {
		t.Errorf("user rate refusal: %v", m)
	}
}

// TestAddressRateAcrossReplicas: requests without a token from one client
// address, over two replicas (-address-rate 10/s, -address-burst 5),
// judged from the answers alone as TestAPIRateAcrossReplicas judges the
// token's rate: no interval admits more than burst + rate × its length,
// no refusal came while the address had room (a refusal from memory judged
// as the limiter judges it, up to one statement's way back before it), the
// load reached the rate,
// and every refusal is 429 too-many-requests with scope address, limit,
// retryAfter, Retry-After and the RateLimit headers.
func TestAddressRateAcrossReplicas(t *testing.T) {
	t.Parallel()
	const (
		rate  = 10.0
		burst = 5
	)
	procs, _ := studio(t, 2, "-address-rate", "10/s", "-address-burst", "5")
	var (
		mu      sync.Mutex
		answers []rateAnswer
		wg      sync.WaitGroup
	)
	stop := time.Now().Add(3 * time.Second)
	for i := range 6 {
		wg.Go(func() {
			for n := 0; time.Now().Before(stop); n++ {
				start := time.Now()
				r, err := sendFrom(context.Background(), clientIP, http.MethodGet, procs[(i+n)%2].URL+"/api/limits", "", "", nil)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				answers = append(answers, rateAnswer{start: start, end: time.Now(), r: r})
				mu.Unlock()
				time.Sleep(5 * time.Millisecond)
			}
		})
	}
	wg.Wait()
	var admitted, refusals []rateAnswer
	for _, a := range answers {
		if p := a.r.Header.Get("RateLimit-Policy"); p != `"address";q=10;w=1;pglimit-burst=5` {
			t.Errorf("%d: RateLimit-Policy %q", a.r.Status, p)
		}
		if l := a.r.Header.Get("RateLimit"); !strings.HasPrefix(l, `"address";r=`) {
			t.Errorf("%d: RateLimit %q", a.r.Status, l)
		}
		switch a.r.Status {
		case http.StatusUnauthorized:
			admitted = append(admitted, a)
		case http.StatusTooManyRequests:
			refusals = append(refusals, a)
			m := a.r.problemOf(t, http.StatusTooManyRequests, "too-many-requests")
			retry, _ := m["retryAfter"].(float64)
			if m["scope"] != "address" || m["limit"] != float64(10) || retry < 1 || a.r.Header.Get("Retry-After") == "" {
				t.Errorf("refusal: %v Retry-After %q", m, a.r.Header.Get("Retry-After"))
			}
		default:
			t.Errorf("%d %s", a.r.Status, a.r.Body)
		}
	}
	excess, where := rateExcess(admitted, rate)
	// A refusal answered from memory is judged at the database's time
	// from below: as if it had been decided up to one statement's way
	// back earlier (ratelimit's clock.below). Each refusal is
	// judged from that much before its send: the longest answer seen,
	// which bounds any statement's way back.
	var slack time.Duration
	for _, a := range answers {
		slack = max(slack, a.end.Sub(a.start))
	}
	early := make([]rateAnswer, len(refusals))
	for i, r := range refusals {
		early[i] = r
		early[i].start = r.start.Add(-slack)
	}
	falseRefused := falseRateRefusals(admitted, early, rate, burst)
	t.Logf("%d requests, %d admitted, %d refused (%d false, judged %v early); most admitted beyond the rate in one interval: %.2f (burst %d)%s",
		len(answers), len(admitted), len(refusals), falseRefused, slack.Round(time.Millisecond), excess, burst, where)
	if excess > burst {
		t.Errorf("over-grant: %.2f admitted beyond the rate in one interval, more than the burst of %d%s", excess, burst, where)
	}
	if falseRefused > 0 {
		t.Errorf("%d of %d refusals came while the address had room for the request", falseRefused, len(refusals))
	}
	if len(refusals) == 0 || len(admitted) <= burst {
		t.Errorf("%d admitted, %d refused: the load did not reach the rate", len(admitted), len(refusals))
	}
}

// TestAddressKeysMemory: ten thousand distinct spoofed client addresses
// (then ten thousand more) through the trusted proxy, each twice (admitted, then refused: -address
// -burst 1 at 1/h, so each refusal is remembered until its time, in the
// bounded table of refusals), leave the replica's heap bounded. It reads
// go_memstats_heap_inuse_bytes from /metrics before and after and logs
// both; the bound it holds the growth to is generous (the table of
// refusals keeps at most 10,000 keys, a few hundred bytes each).
func TestAddressKeysMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("20,000 requests")
	}
	t.Parallel()
	procs, _ := studio(t, 1, "-trusted-proxies", proxyIP+"/32", "-address-rate", "1/h", "-address-burst", "1")
	base := procs[0].URL
	ctx := context.Background()
	send := func(i int) *response {
		xff := fmt.Sprintf("198.%d.%d.%d", 18+i>>16, (i>>8)&0xff, i&0xff)
		r, err := sendFrom(ctx, proxyIP, http.MethodGet, base+"/api/limits", xff, "", nil)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	// Warm up: the pools, the limiter, the first keys.
	for i := range 200 {
		send(1<<20 + i)
	}
	before := heapInuse(t, base)
	const n = 10000
	// round sends n distinct addresses from the offset, each twice, over
	// 8 workers, and checks each was admitted once and refused once.
	round := func(offset int) {
		var wg sync.WaitGroup
		statuses := make([]map[int]int, 8)
		for w := range 8 {
			statuses[w] = map[int]int{}
			wg.Go(func() {
				for pass := range 2 {
					for i := w; i < n; i += 8 {
						statuses[w][pass*1000+send(offset+i).Status]++
					}
				}
			})
		}
		wg.Wait()
		got := map[int]int{}
		for _, s := range statuses {
			for k, v := range s {
				got[k] += v
			}
		}
		if got[401] != n || got[1429] != n {
			t.Errorf("answers %v: want %d 401 in the first pass and %d 429 in the second", got, n, n)
		}
	}
	round(0)
	after := heapInuse(t, base)
	// Ten thousand more: the table of refusals is full, the heap stays.
	round(n)
	again := heapInuse(t, base)
	t.Logf("heap in use: %.1f MB before, %.1f MB after %d distinct addresses (each admitted, then refused), %.1f MB after %d more",
		float64(before)/1e6, float64(after)/1e6, n, float64(again)/1e6, n)
	if after-before > 64<<20 || again-before > 64<<20 {
		t.Errorf("the heap grew by %.1f MB, then %.1f MB, over %d addresses", float64(after-before)/1e6, float64(again-before)/1e6, 2*n)
	}
}

// heapInuse reads go_memstats_heap_inuse_bytes from base's /metrics.
func heapInuse(t *testing.T, base string) int64 {
	t.Helper()
	sc := bufio.NewScanner(strings.NewReader(scrape(t, base)))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_memstats_heap_inuse_bytes "); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				t.Fatal(err)
			}
			return int64(f)
		}
	}
	t.Fatal("/metrics has no go_memstats_heap_inuse_bytes")
	return 0
}
