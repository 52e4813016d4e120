package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/ratelimit"
)

// TestKeys: 25 keys that spent 1..25 of a burst of 30 on two replicas are
// listed in key order by pages of 10, each with the remaining the
// decisions left (30 - spent), and listing twice consumes nothing; a key
// with an override is judged by it; max outside 1..1000 is an error, and
// a limiter with only a PolicyFunc has no policies to judge by.
func TestKeys(t *testing.T) {
	t.Parallel()
	policy := ratelimit.Policy{Name: "api", Limit: 30, Window: time.Hour}
	ls, stores := overriddenReplicas(t, 2, policy, false)
	ctx := context.Background()
	for i := range 25 {
		for n := range i + 1 {
			if _, err := ls[n%2].Acquire(ctx, fmt.Sprintf("k%02d", i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	if _, err := stores[0].Set(ctx, "api", "user:k03", 60, 0); err != nil {
		t.Fatal(err)
	}
	waitInForce(t, "the override", func() bool { n, ok := stores[1].Limit("api", "user:k03"); return ok && n == 60 })
	for round := range 2 {
		var got []ratelimit.KeyState
		for after := ""; ; {
			page, err := ls[1].Keys(ctx, after, 10)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) == 0 {
				break
			}
			got = append(got, page...)
			after = page[len(page)-1].Key
		}
		if len(got) != 25 {
			t.Fatalf("round %d: %d keys listed, want 25", round, len(got))
		}
		for i, ks := range got {
			want := fmt.Sprintf("k%02d", i)
			remaining, limit := 30-(i+1), 30
			if want == "k03" {
				remaining, limit = 60-2*4, 60 // 4 spent of a burst scaled 30 → 60
			}
			if ks.Key != want || len(ks.Policies) != 1 || ks.Policies[0].Remaining != remaining || ks.Policies[0].Limit != limit || ks.Policies[0].Reset <= 0 {
				t.Fatalf("round %d, key %d: %+v, want %s with %d remaining of %d", round, i, ks, want, remaining, limit)
			}
		}
	}
	for _, max := range []int{0, -1, 1001} {
		if _, err := ls[0].Keys(ctx, "", max); err == nil {
			t.Errorf("Keys with max %d: no error", max)
		}
	}
	other := newLimiter(t, pgtest.Pool(t, pgtest.URL(t), 2), options{
		PolicyFunc: func(*http.Request, string) []ratelimit.Policy { return []ratelimit.Policy{policy} },
	})
	if _, err := other.Keys(ctx, "", 10); !errors.Is(err, ratelimit.ErrInvalidPolicy) {
		t.Errorf("Keys of a PolicyFunc limiter: %v, want ErrInvalidPolicy", err)
	}
}
