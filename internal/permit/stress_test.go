package permit_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/permit"
)

// attempt is one claim as its caller saw it: from the call to the return
// of the refused Claim, or of Release (which returns once the release has
// reached the database).
type attempt struct {
	user         string
	start, end   time.Time
	refusedScope string // "" when granted
}

// TestNoFalseRefusalsUnderChurn runs the heavy shape (a user's scope of cap
// 2 and an installation scope of cap 4) from three leasers (replicas),
// with four users of six callers each (two on each replica) claiming, holding a few
// milliseconds and releasing, and judges every refusal by the callers' own
// ledger: a refusal by a user's scope is false when fewer than 2 other
// attempts of that user were between their call and their release's
// return at some moment of the refused attempt; one by the installation
// when fewer than 4 attempts of anyone were.
func TestNoFalseRefusalsUnderChurn(t *testing.T) {
	t.Parallel()
	for _, onShard := range []bool{false, true} {
		t.Run(map[bool]string{false: "statements", true: "shard function"}[onShard], func(t *testing.T) {
			t.Parallel()
			noFalseRefusalsUnderChurn(t, onShard)
		})
	}
}

func noFalseRefusalsUnderChurn(t *testing.T, onShard bool) {
	pools, _ := replicas(t, 3, 4)
	ls := leasersVia(t, pools, permit.HeavyPermit, onShard)
	const users, callers = 4, 6
	d := 4 * time.Second
	if testing.Short() {
		d = 2 * time.Second
	}
	var (
		mu  sync.Mutex
		log []attempt
		wg  sync.WaitGroup
	)
	stop := time.Now().Add(d)
	ctx := context.Background()
	for u := 0; u < users; u++ {
		for c := 0; c < callers; c++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				l := ls[c%len(ls)] // two callers of each user on each replica
				user := fmt.Sprintf("u%d", u)
				for time.Now().Before(stop) {
					a := attempt{user: user, start: time.Now()}
					lease, err := l.Claim(ctx, permit.Claim{
						Scopes: []permit.Scope{{Key: "user:e:" + user, Cap: 2}, {Key: "installation", Cap: 4}},
						Holder: user, Endpoint: "e", Lease: time.Minute,
					})
					var refused *permit.RefusedError
					switch {
					case errors.As(err, &refused):
						a.refusedScope = refused.Scope.Key
					case err != nil:
						t.Error(err)
						return
					default:
						time.Sleep(time.Duration(rand.IntN(3000)) * time.Microsecond)
						if err := lease.Release(ctx); err != nil {
							t.Error(err)
							return
						}
					}
					a.end = time.Now()
					mu.Lock()
					log = append(log, a)
					mu.Unlock()
				}
			}()
		}
	}
	wg.Wait()
	overlapping := func(r attempt, same func(attempt) bool) int {
		n := 0
		for _, h := range log {
			if h.refusedScope != "" || !same(h) || h == r {
				continue
			}
			if h.start.Before(r.end) && h.end.After(r.start) {
				n++
			}
		}
		return n
	}
	var granted, refusedUser, refusedInst, falseUser, falseInst int
	for _, r := range log {
		switch r.refusedScope {
		case "":
			granted++
		case "installation":
			refusedInst++
			if overlapping(r, func(attempt) bool { return true }) < 4 {
				falseInst++
			}
		default:
			refusedUser++
			if overlapping(r, func(h attempt) bool { return h.user == r.user }) < 2 {
				falseUser++
			}
		}
	}
	t.Logf("%d granted, %d refused by a user's cap (%d false), %d by the installation's (%d false)", granted, refusedUser, falseUser, refusedInst, falseInst)
	if falseUser+falseInst > 0 {
		t.Fatalf("%d false refusals by a user's cap, %d by the installation's", falseUser, falseInst)
	}
}
