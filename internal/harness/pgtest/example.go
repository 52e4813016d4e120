package pgtest

import (
	"fmt"
	"os"
	"testing"
)

// MainWithExampleDatabase is Main for a package whose runnable examples
// connect the way a service does, to os.Getenv("DATABASE_URL"), so a
// reader can copy them as they are: before the tests it sets DATABASE_URL,
// for this test binary only, to a fresh, empty database of the test
// server (the examples migrate it themselves, with pglimit.Migrate), and
// after the tests it drops that database. The examples of one package run
// one after another on that database: each uses keys of its own.
func MainWithExampleDatabase(m *testing.M) {
	endTurn := takeTurn(turnShared) // before DATABASE_URL names the example's database
	tb := &exampleTB{}
	url := EmptyURL(tb) // fixes the server first, from the environment as it was
	if err := os.Setenv("DATABASE_URL", url); err != nil {
		panic(fmt.Sprintf("pgtest: %v", err))
	}
	code := m.Run()
	tb.cleanup()
	if stopServer != nil {
		stopServer()
	}
	endTurn()
	os.Exit(code)
}
