package pgtest

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/jackc/pgx/v5"
)

// Test binaries take turns on a shared server. go test runs several test
// binaries at once (one per package, up to -p, the number of cores), and
// each opens up to tens of connections (replicas and their pools): on a
// server of TEST_DATABASE_URL or DATABASE_URL, which they share, together
// they could ask for more than its max_connections, and a test would fail
// with "remaining connection slots are reserved" (SQLSTATE 53300) for no
// fault of the code. So each binary holds a turn while it runs: one of
// (max_connections − superuser_reserved_connections − turnMargin) /
// perBinary turns, a session advisory lock of its own connection, and a
// binary that opens about a whole server's connections (MainAlone: the
// load check) holds every turn. A throwaway server (embedpg, a Docker
// container) is the binary's own: no turn is taken.

// perBinary is the most connections one test binary opens at once, but
// for a MainAlone one: cmd/studio's, 44 measured (three replicas and the
// test's own pools; ratelimit 34, middleware/signin 33, cmd/scalecheck 22).
const perBinary = 45

// turnMargin leaves connections to whatever else uses the server (psql, a
// service under development).
const turnMargin = 5

// turnClass is the first key of every turn's advisory lock
// (pg_advisory_lock(int, int)): hashtext('pglimit tests: a turn').
const turnClass = "pglimit tests: a turn"

// turnKind is what a test binary takes of the turns.
type turnKind int

const (
	turnNone   turnKind = iota // none (the public kit's Main: an adopter's tests)
	turnShared                 // one
	turnAlone                  // every one
)

// takeTurn waits for a turn on the shared server the environment names (with
// turnAlone, for every turn) and returns what ends it (closing the
// connection that holds it). Without a shared server, or when it cannot be
// reached (the tests then say why), it takes none.
func takeTurn(kind turnKind) (end func()) {
	u := sharedServerURL()
	if u == "" || kind == turnNone {
		return func() {}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return func() {}
	}
	end = func() { _ = conn.Close(context.Background()) }
	var budget int
	if err := conn.QueryRow(ctx, `SELECT current_setting('max_connections')::int - current_setting('superuser_reserved_connections')::int`).
		Scan(&budget); err != nil {
		return end
	}
	turns := max(1, (budget-turnMargin)/perBinary)
	wait := context.Background() // a turn is waited for as long as it takes: go test's -timeout bounds it
	if kind == turnAlone {
		say := time.AfterFunc(time.Second, func() {
			fmt.Fprintf(os.Stderr, "pgtest: waiting until no other test binary uses %s (this one opens about all its connections)\n", redact(u))
		})
		defer say.Stop()
		for i := range turns {
			if _, err := conn.Exec(wait, `SELECT pg_advisory_lock(hashtext($1), $2)`, turnClass, i); err != nil {
				return end
			}
		}
		return end
	}
	for said := false; ; {
		for i := range turns {
			var got bool
			if err := conn.QueryRow(wait, `SELECT pg_try_advisory_lock(hashtext($1), $2)`, turnClass, i).Scan(&got); err != nil {
				return end
			}
			if got {
				return end
			}
		}
		if !said {
			fmt.Fprintf(os.Stderr, "pgtest: %d test binaries already use %s, all it has connections for; waiting for a turn\n", turns, redact(u))
			said = true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// sharedServerURL is the server of TEST_DATABASE_URL or DATABASE_URL, as
// findServer takes it; "" when the tests start a server of their own.
func sharedServerURL() string {
	for _, name := range []string{"TEST_DATABASE_URL", "DATABASE_URL"} {
		if u := os.Getenv(name); u != "" {
			return u
		}
	}
	return ""
}
