package heavy_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
)

// BenchmarkHeavyPermit measures what a heavy request adds: claiming the
// user's and the installation's permits in one round trip and releasing
// both in one, at 1 and 16 concurrent clients (each its own user), beside
// the floor (SELECT 1 on the same pool) measured in the same run. Compare with benchstat or read ns/op side by
// side: BenchmarkHeavyPermit/clients=1/select1 is the floor.
func BenchmarkHeavyPermit(b *testing.B) {
	url := pgtest.URL(b)
	pool := pgtest.Pool(b, url, 20)
	l, err := heavy.New(pool, heavy.Options{Name: "bench", Key: userHeader, Limit: 2, Time: time.Minute, InstallationLimit: 64})
	if err != nil {
		b.Fatal(err)
	}
	q := db.New()
	var users atomic.Int64

	paths := []struct {
		name string
		op   func(ctx context.Context, user string) error
	}{
		{"select1", func(ctx context.Context, _ string) error { return q.SessionPing(ctx, pool) }},
		{"heavy-claim+release", func(ctx context.Context, user string) error {
			p, err := l.Acquire(ctx, user)
			if err != nil {
				return err
			}
			return p.Release(ctx)
		}},
	}
	for _, clients := range []int{1, 16} {
		for _, path := range paths {
			b.Run(fmt.Sprintf("clients=%d/%s", clients, path.name), func(b *testing.B) {
				ctx := context.Background()
				if clients == 1 {
					user := fmt.Sprintf("u%d", users.Add(1))
					for b.Loop() {
						if err := path.op(ctx, user); err != nil {
							b.Fatal(err)
						}
					}
					return
				}
				b.SetParallelism(max(1, clients/max(1, testingProcs())))
				b.RunParallel(func(pb *testing.PB) {
					user := fmt.Sprintf("u%d", users.Add(1))
					for pb.Next() {
						if err := path.op(ctx, user); err != nil {
							b.Error(err)
							return
						}
					}
				})
			})
		}
	}
}
