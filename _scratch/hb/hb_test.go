package hb

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/ratelimit"
)

func BenchmarkBorrowHandler(b *testing.B) {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		b.Fatal(err)
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	key := func(r *http.Request) (string, bool) { k := r.Header.Get("X-Key"); return k, k != "" }
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	rlb, err := ratelimit.New(pool, ratelimit.Options{Name: "hb-borrow", Key: key, Logger: quiet, Borrow: true,
		Policies: []ratelimit.Policy{{Name: "fast", Limit: 1_000_000, Window: time.Second}}})
	if err != nil {
		b.Fatal(err)
	}
	h := rlb.Handler(ok)
	req := httptest.NewRequest("GET", "/x", nil)
	req.Header.Set("X-Key", "k")
	for range 2000 {
		h.ServeHTTP(httptest.NewRecorder(), req)
		time.Sleep(50 * time.Microsecond)
	}
	b.ResetTimer()
	for b.Loop() {
		h.ServeHTTP(httptest.NewRecorder(), req)
	}
}
