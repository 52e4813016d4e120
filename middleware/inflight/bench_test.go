package inflight_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// BenchmarkWholeRequestKept measures a steady client — one keep-alive
// connection, one request after another — through the in-flight cap with
// and without Options.Keep, beside the handler alone: each iteration
// sends one request through each in turn, so the machine's other work
// falls on all three alike. It reports each one's p50 and its ratio to
// the handler alone (issue 30's goal for the kept slot: at most 1.5).
func BenchmarkWholeRequestKept(b *testing.B) {
	ctx := context.Background()
	url := pgtest.URL(b)
	pool := pgtest.Pool(b, url, 8)
	pgtest.Listen(b, pool)
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "ok\n")
	})
	key := func(r *http.Request) (string, bool) { k := r.Header.Get("X-Key"); return k, k != "" }
	var hs []http.Handler
	for _, keep := range []time.Duration{0, time.Second} {
		l, err := inflight.New(pool, inflight.Options{Key: key, Keep: keep, Replica: "bench", Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = l.Flush(ctx) })
		hs = append(hs, l.Handler(ok))
	}
	chains := []http.Handler{ok, hs[0], hs[1]}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16, IdleConnTimeout: time.Minute}}
	var urls []string
	for _, h := range chains {
		srv := httptest.NewServer(h)
		b.Cleanup(srv.Close)
		urls = append(urls, srv.URL+"/bench")
	}
	run := func(i int) time.Duration {
		t := time.Now()
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, urls[i], nil)
		req.Header.Set("X-Key", "steady-client")
		res, err := client.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		if res.StatusCode != http.StatusOK {
			b.Fatalf("%s: status %d", urls[i], res.StatusCode)
		}
		return time.Since(t)
	}
	for range 300 { // connections open, statements prepared, the slot kept
		for i := range chains {
			run(i)
		}
	}
	lat := make([][]time.Duration, len(chains))
	for b.Loop() {
		for i := range chains {
			lat[i] = append(lat[i], run(i))
		}
	}
	p50 := make([]float64, len(chains))
	for i := range lat {
		slices.Sort(lat[i])
		p50[i] = float64(lat[i][len(lat[i])/2].Nanoseconds())
	}
	b.ReportMetric(p50[0], "alone-p50-ns")
	b.ReportMetric(p50[1], "inflight-p50-ns")
	b.ReportMetric(p50[2], "kept-p50-ns")
	b.ReportMetric(p50[1]/p50[0], "inflight/alone")
	b.ReportMetric(p50[2]/p50[0], "kept/alone")
}
