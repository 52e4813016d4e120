package pglimitgrpc_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	pglimitgrpc "github.com/pglimit/pglimit/grpc"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
)

// TestSequentialCallerNeverRefusedByItsOwnSlot is issue 42's point 7 over
// gRPC: a tenant with an in-flight cap of 1 and a heavy cap of 1 (the
// in-flight interceptor around the heavy one, as cmd/studio nests them
// over HTTP) makes call after call, each once the previous one returned,
// on the next of three servers (three pools on one database). In two
// calls of three, the handler has another session lock the call's heavy
// or in-flight row for 1.5 s, so its release waits for it, far within the
// limiters' Timeout (30 s): the database answers, slowly. Judged by an
// observer pool the moment each call returned: none of the tenant's slots
// is still live, no call is refused, and a slowed call returned only after
// its row was free. Before the call's end waited for its releases as the
// HTTP Handlers' answers do, it waited a fixed second, and the next call
// was refused by the tenant's own slot.
func TestSequentialCallerNeverRefusedByItsOwnSlot(t *testing.T) {
	t.Parallel()
	const (
		calls   = 12
		stall   = 1500 * time.Millisecond
		timeout = 30 * time.Second
	)
	ctx := context.Background()
	u := pgtest.URL(t)
	staller := pgtest.Pool(t, u, 2)
	observer := pgtest.Pool(t, u, 1)
	var stalls sync.WaitGroup
	t.Cleanup(stalls.Wait)
	stallKind := make(chan string, 1)
	svc := &health{check: func(context.Context) error {
		kind := <-stallKind
		if kind == "" {
			return nil
		}
		tx, err := staller.Begin(ctx)
		if err != nil {
			return err
		}
		rows, _ := tx.Query(ctx, `SELECT slot FROM pglimit.slot WHERE kind = $1 AND holder = 'acme' AND scope <> 'installation'
			AND expires_at > now() FOR UPDATE`, kind)
		locked, err := pgx.CollectRows(rows, pgx.RowTo[int32])
		if err != nil || len(locked) != 1 {
			_ = tx.Rollback(ctx)
			return fmt.Errorf("locking the %s row: %d rows, %v", kind, len(locked), err)
		}
		stalls.Go(func() {
			time.Sleep(stall)
			_ = tx.Commit(ctx)
		})
		return nil
	}}
	var clients []healthpb.HealthClient
	for range 3 {
		pool := pgtest.Pool(t, u, 4)
		fl, err := inflight.New(pool, inflight.Options{Key: noHTTP, Limit: 1, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		hv, err := heavy.New(pool, heavy.Options{Name: "report", Key: noHTTP, Limit: 1, InstallationLimit: 64, Time: timeout, Timeout: timeout})
		if err != nil {
			t.Fatal(err)
		}
		clients = append(clients, serve(t, svc, must(pglimitgrpc.InFlight(fl, pglimitgrpc.Options{Key: tenant})),
			must(pglimitgrpc.Heavy(hv, pglimitgrpc.Options{Key: tenant, Methods: []string{methodCheck}}))))
	}
	var shortest time.Duration
	for n := range calls {
		kind := []string{"heavy_permit", "request_in_flight", ""}[n%3]
		stallKind <- kind
		start := time.Now()
		_, err := clients[n%3].Check(as(ctx, "acme"), &healthpb.HealthCheckRequest{})
		took := time.Since(start)
		if err != nil {
			t.Fatalf("call %d (stalled %q): %v (reason %q): refused though the previous call had returned", n, kind, err, reasonOf(err))
		}
		var live int
		if err := observer.QueryRow(ctx, `SELECT count(*) FROM pglimit.slot WHERE holder = 'acme' AND expires_at > now()`).Scan(&live); err != nil {
			t.Fatal(err)
		}
		if live != 0 {
			t.Errorf("call %d (stalled %q): %d of the tenant's slots still live once it returned after %v", n, kind, live, took.Round(time.Millisecond))
		}
		if kind != "" {
			if took < stall {
				t.Errorf("call %d: returned after %v, before its %s row was free (held %v)", n, took.Round(time.Millisecond), kind, stall)
			}
			if shortest == 0 || took < shortest {
				shortest = took
			}
		}
	}
	t.Logf("%d sequential calls over 3 servers, two in three with a release held %v: none refused; the shortest stalled call took %v",
		calls, stall, shortest.Round(time.Millisecond))
}
