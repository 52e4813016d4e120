package pglimit_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
)

// A service migrates pglimit's schema after its own migrations and runs
// pglimit's background parts beside its HTTP server until it shuts down:
// every replica does both. examples/adopt is a whole service doing it.
func Example() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL")) // behind PgBouncer: add default_query_exec_mode=exec
	if err != nil {
		log.Fatal(err)
	}
	defer pool.Close()
	// ... the service's own migrations ...
	if err := pglimit.Migrate(ctx, pool); err != nil { // schema pglimit, every replica at once
		log.Fatal(err)
	}

	runCtx, shutdown := context.WithCancel(ctx) // in a service: signal.NotifyContext(ctx, syscall.SIGTERM)
	ran := make(chan error, 1)
	go func() { ran <- pglimit.Run(runCtx, pool, pglimit.RunOptions{Replica: "api-1"}) }()

	// ... wrap the handlers, serve HTTP until shutdown ...

	shutdown()
	fmt.Println("run:", <-ran) // nil after a shutdown; an error that stopped it early otherwise
	// Output: run: <nil>
}

// Classify tells what a database error means for the answer: 503 for a
// database that cannot be reached or did not answer in time, nothing for a
// client that went away, 500 (logged, never sent) for the rest.
func ExampleClassify() {
	for _, err := range []error{
		nil,
		context.Canceled,
		&pgconn.PgError{Code: "08006"}, // connection failure
		&pgconn.PgError{Code: "57014"}, // statement_timeout
		errors.New("duplicate key"),
	} {
		fmt.Println(pglimit.Classify(err))
	}
	// Output:
	// none
	// canceled
	// unavailable
	// timeout
	// other
}
