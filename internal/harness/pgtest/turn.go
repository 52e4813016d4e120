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
// connection that holds it). A binary waiting for a turn holds no
// connection, but for the one alone, which queues on the turns' locks one
// after another. The wait counts against go test's
// -timeout, whose kill (at the timeout plus a minute) runs from the
// binary's start: with -p 2 (two cores) a binary waits at most for the one
// other binary running, the longest of which (cmd/studio's) takes about
// 4.5 minutes beside two CPU hogs. Without a shared server it takes no
// turn; when the server cannot be reached for a minute, or refuses the
// locks, it says so on stderr and takes none (the tests then say why).
func takeTurn(kind turnKind) (end func()) {
	u := sharedServerURL()
	if u == "" || kind == turnNone {
		return func() {}
	}
	none := func(why string, err error) func() {
		fmt.Fprintf(os.Stderr, "pgtest: the tests run without a turn on %s: %s: %v\n", redact(u), why, err)
		return func() {}
	}
	start := time.Now()
	connect := func() (*pgx.Conn, error) {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			conn, err := pgx.Connect(ctx, u)
			cancel()
			if err == nil || time.Since(start) > time.Minute {
				return conn, err
			}
			time.Sleep(time.Second) // full (SQLSTATE 53300) or starting: try again
		}
	}
	wait := context.Background() // as long as it takes: see above
	turns := 0
	for said := false; ; {
		conn, err := connect()
		if err != nil {
			return none("no connection", err)
		}
		end = func() { _ = conn.Close(context.Background()) }
		if turns == 0 {
			var budget int
			if err := conn.QueryRow(wait, `SELECT current_setting('max_connections')::int
				- current_setting('superuser_reserved_connections')::int
				- coalesce(current_setting('reserved_connections', true)::int, 0)`).Scan(&budget); err != nil {
				end()
				return none("reading max_connections", err)
			}
			turns = max(1, (budget-turnMargin)/perBinary)
		}
		if kind == turnAlone {
			say := time.AfterFunc(time.Second, func() {
				fmt.Fprintf(os.Stderr, "pgtest: waiting until no other test binary uses %s (this one opens about all its connections)\n", redact(u))
			})
			defer say.Stop()
			for i := range turns {
				if _, err := conn.Exec(wait, `SELECT pg_advisory_lock(hashtext($1), $2)`, turnClass, i); err != nil {
					end()
					return none("taking every turn", err)
				}
			}
			return end
		}
		for i := range turns {
			var got bool
			if err := conn.QueryRow(wait, `SELECT pg_try_advisory_lock(hashtext($1), $2)`, turnClass, i).Scan(&got); err != nil {
				end()
				return none("taking a turn", err)
			}
			if got {
				return end
			}
		}
		end() // no connection held while waiting
		if !said {
			fmt.Fprintf(os.Stderr, "pgtest: %d test binaries already use %s, all it has connections for; waiting for a turn\n", turns, redact(u))
			said = true
		}
		time.Sleep(200 * time.Millisecond)
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
