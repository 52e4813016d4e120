package main_test

// Tests of the smaller defects of issue 11, section 6.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/pgtest"
)

// TestClientGoneIsNotAServerError: a client that goes away while its
// request waits on the database — its token lookup, its permit claim, its
// sign-in throttle check, each held up by a table lock the test takes — is
// not a server error: the service logs it at debug level and writes no
// 500 and no ERROR (or database-unavailable WARN) line.
func TestClientGoneIsNotAServerError(t *testing.T) {
	t.Parallel()
	procs, dbURL := studio(t, 1, "-log-level", "debug")
	p := procs[0]
	locker := pgtest.Pool(t, dbURL, 1)
	obs := pgtest.Pool(t, dbURL, 1)
	for i, tc := range []struct {
		name, table, method, path, token string
		body                             any
	}{
		{"token lookup", "api_token", http.MethodGet, "/api/limits", "alice-token", nil},
		{"permit claim", "pglimit.heavy_permit", http.MethodGet, "/api/flow", "bob-token", nil},
		{"sign-in check", "pglimit.login_attempt", http.MethodPost, "/api/session", "", map[string]string{"username": "carol", "password": "nope"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			tx, err := locker.Begin(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer func() { _ = tx.Rollback(ctx) }()
			if _, err := tx.Exec(ctx, `LOCK TABLE `+tc.table+` IN ACCESS EXCLUSIVE MODE`); err != nil {
				t.Fatal(err)
			}
			reqCtx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				_, err := send(reqCtx, tc.method, p.URL+tc.path, tc.token, tc.body)
				done <- err
			}()
			waitFor(t, 10*time.Second, "the request waiting on the lock", func() bool {
				return count(obs, `SELECT count(*) FROM pg_locks WHERE NOT granted AND relation = $1::regclass`, tc.table) > 0
			})
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the request answered although its client went away")
			}
			// The service sees the client gone and says so at debug level.
			waitFor(t, 10*time.Second, "the debug line of the canceled request", func() bool {
				return strings.Count(p.Tail(1<<20), "client went away") > i
			})
			if err := tx.Rollback(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
	log := p.Tail(1 << 20)
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"level":"ERROR"`) || strings.Contains(line, "database unavailable") || strings.Contains(line, "internal error") {
			t.Errorf("a client that went away was logged as a server failure: %s", line)
		}
	}
}
