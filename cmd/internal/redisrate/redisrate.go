// Package redisrate is the redis_rate baseline of the benchmarks: importing
// it makes github.com/go-redis/redis_rate's Allow on a local Redis a
// baseline of cmd/internal/bench, beside SELECT 1 and the one-row upsert. It
// lives in the cmd module so that Redis never reaches the library's.
package redisrate

import (
	"context"
	"fmt"
	"strconv"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/pglimit/pglimit/cmd/internal/bench"
)

func init() { bench.RedisRate = newRedisRate }

// newRedisRate returns redis_rate's Allow on addr as the op of a loop, with
// a limit so high that nothing is refused, on a key of the loop's own (the
// key of a per-user limit); or a note saying why there is none.
func newRedisRate(ctx context.Context, addr string) (func(worker int) bench.Op, func(), string) {
	rdb := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 64})
	if err := rdb.Ping(ctx).Err(); err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Sprintf("Redis at %s does not answer (%v): baseline skipped", addr, err)
	}
	lim := redis_rate.NewLimiter(rdb)
	limit := redis_rate.PerSecond(1_000_000_000)
	op := func(worker int) bench.Op {
		key := "pglimit-bench:" + strconv.Itoa(worker)
		return func(ctx context.Context) error {
			res, err := lim.Allow(ctx, key, limit)
			if err != nil {
				return err
			}
			if res.Allowed != 1 {
				return fmt.Errorf("redis_rate refused: %v", res)
			}
			return nil
		}
	}
	version := ""
	if info, err := rdb.InfoMap(ctx, "server").Result(); err == nil {
		version = info["Server"]["redis_version"]
	}
	return op, func() { _ = rdb.Close() }, "Redis " + version + " at " + addr
}
