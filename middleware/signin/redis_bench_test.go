package signin_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// The Redis baseline: redis_rate's GCRA limiter (one Lua script call per
// decision) against the local Redis. Only this benchmark imports Redis;
// pglimit never depends on it.
func init() {
	redisBaseline = func(b *testing.B, n int) {
		rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", PoolSize: 16})
		defer rdb.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Skipf("Redis at 127.0.0.1:6379 does not answer (%v): skipping only the Redis baseline", err)
		}
		limiter := redis_rate.NewLimiter(rdb)
		clients(b, n, func(ctx context.Context, c, _ int) error {
			_, err := limiter.Allow(ctx, fmt.Sprint("pglimit-bench-", c), redis_rate.PerSecond(1_000_000_000))
			return err
		})
	}
}
