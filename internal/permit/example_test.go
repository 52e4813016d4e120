package permit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/permit"
)

// A Leaser needs no HTTP: here a job runner lets at most two reports of a
// tenant run at once across all its workers, and at most five of all
// tenants, one claim for both.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	leaser := permit.New(pool, permit.Options{Kind: permit.HeavyPermit})
	claim := permit.Claim{
		Scopes: []permit.Scope{
			{Key: permit.ScopeKey("reports", "tenant-7"), Cap: 2},
			{Key: "reports", Cap: 5},
		},
		Holder: "tenant-7", Endpoint: "monthly-report",
		Lease: 10 * time.Minute, // lapses on its own if the worker dies
	}
	var leases []*permit.Lease
	for range 3 {
		lease, err := leaser.Claim(ctx, claim)
		var refused *permit.RefusedError
		if errors.As(err, &refused) {
			fmt.Printf("refused: %s full (%d of %d)\n", refused.Scope.Key, refused.Live, refused.Scope.Cap)
			continue
		}
		if err != nil {
			log.Fatal(err)
		}
		fmt.Println("granted slots", lease.Slots)
		leases = append(leases, lease)
	}
	for _, l := range leases {
		_ = l.Release(ctx) // when the report is done
	}
	// Output:
	// granted slots [1 1]
	// granted slots [2 2]
	// refused: reports:tenant-7 full (2 of 2)
}
