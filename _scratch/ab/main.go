package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/ratelimit"
)

func main() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		panic(err)
	}
	if err := pglimit.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	key := func(r *http.Request) (string, bool) { k := r.Header.Get("X-Key"); return k, k != "" }
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	flight, _ := inflight.New(pool, inflight.Options{Name: "ab", Key: key, Replica: "ab", Logger: quiet})
	rlb, err := ratelimit.New(pool, ratelimit.Options{Name: "ab-borrow", Key: key, Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1_000_000, Window: time.Second}}})
	if err != nil {
		panic(err)
	}
	variant := os.Getenv("V")
	var chains []http.Handler
	hdr := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("RateLimit-Policy", `"fast";q=1000000;w=1`)
		w.Header().Set("RateLimit", `"fast";r=999999;t=0`)
		_, _ = io.WriteString(w, "ok\n")
	})
	capture := httptest.NewRecorder()
	rlb.Handler(ok).ServeHTTP(capture, func() *http.Request { r := httptest.NewRequest("GET", "/x", nil); r.Header.Set("X-Key", "k"); return r }())
	fmt.Println(capture.Header())
	var inside []time.Duration
	inner := rlb.Handler(ok)
	timed := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.Now()
		inner.ServeHTTP(w, r)
		inside = append(inside, time.Since(t))
	})
	defer func() {
		slices.Sort(inside)
		fmt.Println("inside rlb.Handler p50", inside[len(inside)/2], "p90", inside[len(inside)*9/10])
	}()
	chains = append(chains, flight.Handler(ok), rlb.Handler(flight.Handler(ok)), timed, ok, hdr)
	names := []string{"inflight", "borrow+inflight", "borrow alone", "alone", "headers alone"}
	_ = variant
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	var urls []string
	for _, h := range chains {
		srv := httptest.NewServer(h)
		defer srv.Close()
		urls = append(urls, srv.URL+"/x")
	}
	lat := make([][]time.Duration, len(chains))
	do := func(i int) time.Duration {
		req, _ := http.NewRequest("GET", urls[i], nil)
		req.Header.Set("X-Key", "k")
		t := time.Now()
		res, err := client.Do(req)
		if err != nil {
			panic(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
		return time.Since(t)
	}
	for i := range chains {
		for range 500 {
			do(i)
		}
	}
	for n := 0; n < 8000; n++ {
		for i := range chains {
			lat[i] = append(lat[i], do(i))
		}
	}
	for i := range chains {
		slices.Sort(lat[i])
		fmt.Printf("%-18s p50 %v p90 %v\n", names[i], lat[i][len(lat[i])/2], lat[i][len(lat[i])*9/10])
	}
}
