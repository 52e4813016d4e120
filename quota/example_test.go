package quota_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/quota"
)

// A monthly quota of exported rows per customer, counted in Paris time and
// charged after the fact: the export reserves an estimate before it runs
// and settles what it really sent.
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
	paris, err := time.LoadLocation("Europe/Paris")
	if err != nil {
		log.Fatal(err)
	}
	rows, err := quota.New(pool, quota.Options{Name: "export-rows", Limit: 1000, Period: quota.Month, Location: paris})
	if err != nil {
		log.Fatal(err)
	}

	permit, err := rows.AcquireN(ctx, "tenant:acme", 500) // the estimate
	if err != nil {
		log.Fatal(err)
	}
	sent := int64(120) // what the export really sent
	if err := permit.Settle(ctx, sent); err != nil {
		log.Fatal(err)
	}
	fmt.Println("used", permit.Used, "remaining", permit.Remaining)

	// 900 more do not fit: refused until the month ends in Paris.
	_, err = rows.AcquireN(ctx, "tenant:acme", 900)
	var refused *quota.LimitError
	if errors.As(err, &refused) && errors.Is(err, pglimit.ErrLimited) {
		fmt.Println("refused; the month ends at local midnight:", refused.State.Reset.In(paris).Format("15:04 on day 2"))
	}

	// Charged with the business write: kept exactly when it commits.
	ledger, err := quota.New(pool, quota.Options{Name: "invoices", Limit: 100, Period: quota.Month, Durable: true})
	if err != nil {
		log.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		log.Fatal(err)
	}
	if _, err := ledger.ChargeTx(ctx, tx, "tenant:acme", 1); err != nil {
		log.Fatal(err)
	}
	// ... the invoice's own INSERT in tx ...
	if err := tx.Rollback(ctx); err != nil { // the invoice failed
		log.Fatal(err)
	}
	st, err := ledger.Peek(ctx, "tenant:acme")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("invoices charged after a rollback:", st.Used)
	// Output:
	// used 120 remaining 880
	// refused; the month ends at local midnight: 00:00 on day 1
	// invoices charged after a rollback: 0
}
