package ratelimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/ratelimit"
)

// Outside HTTP — a job runner, a queue consumer — AcquireN spends a
// weighted cost under several policies at once, all or nothing.
func ExampleLimiter_AcquireN() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil { // pglimit's tables, in the schema pglimit
		log.Fatal(err)
	}

	exports, err := ratelimit.New(pool, ratelimit.Options{
		Name: "exports",
		Policies: []ratelimit.Policy{
			{Name: "per-minute", Limit: 10, Window: time.Minute},
			{Name: "per-day", Limit: 12, Window: 24 * time.Hour},
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	for _, rows := range []int{4, 5, 4} { // a unit per 1,000 rows exported
		p, err := exports.AcquireN(ctx, "tenant-42", rows, nil)
		var refused *ratelimit.LimitError
		switch {
		case errors.As(err, &refused):
			fmt.Printf("cost %d refused by %v\n", rows, refused.Violated)
		case err != nil:
			log.Fatal(err) // the database could not decide
		default:
			fmt.Printf("cost %d granted, %d left today\n", rows, p.Policies[1].Remaining)
		}
	}
	// Output:
	// cost 4 granted, 8 left today
	// cost 5 granted, 3 left today
	// cost 4 refused by [per-minute per-day]
}

// A request whose cost is known only after it runs — here the rows an
// export wrote — reserves an estimate and settles the actual cost.
func ExamplePermit_Settle() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	if err := pglimit.Migrate(ctx, pool); err != nil {
		log.Fatal(err)
	}

	exports, err := ratelimit.New(pool, ratelimit.Options{
		Name:     "export-rows",
		Policies: []ratelimit.Policy{{Name: "rows-per-hour", Limit: 100, Window: time.Hour}},
	})
	if err != nil {
		log.Fatal(err)
	}
	p, err := exports.AcquireN(ctx, "tenant-7", 10, nil) // estimate: 10 (thousand rows)
	if err != nil {
		log.Fatal(err)
	}
	rows := 25 // what the export wrote, known now
	if err := p.Settle(ctx, rows); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("charged %d, %d left this hour\n", p.Cost, p.Policies[0].Remaining)
	// Output:
	// charged 25, 75 left this hour
}
