package readroute_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/readroute"
)

// BenchmarkHandler is the router's added cost per request: the health is
// read from memory and nothing on the request path touches a database
// (the pools here point at no server and are never dialled). bare is the
// same handler unwrapped, the baseline.
func BenchmarkHandler(b *testing.B) {
	primary, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:1/none")
	if err != nil {
		b.Fatal(err)
	}
	defer primary.Close()
	replica, err := pgxpool.New(context.Background(), "postgres://nobody@127.0.0.1:2/none")
	if err != nil {
		b.Fatal(err)
	}
	defer replica.Close()
	r, err := readroute.New(primary, replica, readroute.Options{
		Probe: func(context.Context, *pgxpool.Pool) error { return nil },
	})
	if err != nil {
		b.Fatal(err)
	}
	if !r.Check(context.Background()) || !r.Healthy() {
		b.Fatal("not healthy")
	}
	handler := http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if mayLag, _ := readroute.Read(req.Context(), func(pool *pgxpool.Pool, mayLag bool) error { return nil }); mayLag {
			w.WriteHeader(http.StatusOK)
		}
	})
	req := httptest.NewRequest(http.MethodGet, "/api/events", nil)
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{{"bare", handler}, {"routed", r.Handler(handler)}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			w := httptest.NewRecorder()
			for b.Loop() {
				bc.h.ServeHTTP(w, req)
			}
		})
		b.Run(bc.name+"/parallel", func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				w := httptest.NewRecorder()
				for pb.Next() {
					bc.h.ServeHTTP(w, req)
				}
			})
		})
	}
}
