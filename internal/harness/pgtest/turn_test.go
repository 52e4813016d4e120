package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/pglimit/internal/harness/embedpg"
)

// TestTurns: on a shared server of max_connections 105 (97 for the tests:
// two turns of perBinary), two test binaries (stand-ins: two takeTurn) run
// at once and a third waits until one ends; a binary that runs alone waits
// until none runs, and the others wait while it runs. The turns are
// PostgreSQL's advisory locks, held by connections of their own, so they
// hold between processes as between these goroutines.
func TestTurns(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := embedpg.Start(ctx, embedpg.Options{Settings: map[string]string{"max_connections": "105"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	t.Setenv("TEST_DATABASE_URL", c.URL("postgres"))

	turn := func(kind turnKind) <-chan func() {
		got := make(chan func(), 1)
		go func() { got <- takeTurn(kind) }()
		return got
	}
	taken := func(what string, got <-chan func()) func() {
		t.Helper()
		select {
		case end := <-got:
			return end
		case <-ctx.Done():
			t.Fatalf("%s: no turn in two minutes", what)
			return nil
		}
	}
	// waits reports whether got is still waiting a while later: a turn
	// that is free is taken in milliseconds, and one that is held is never
	// taken, however loaded the machine.
	waits := func(what string, got <-chan func()) {
		t.Helper()
		select {
		case end := <-got:
			end()
			t.Fatalf("%s: took a turn that another binary held", what)
		case <-time.After(500 * time.Millisecond):
		}
	}

	first := taken("first", turn(turnShared))
	second := taken("second", turn(turnShared))
	third := turn(turnShared)
	waits("third beside two", third)
	first()
	endThird := taken("third, once the first ended", third)

	alone := turn(turnAlone)
	waits("alone beside two", alone)
	second()
	waits("alone beside one", alone)
	endThird()
	endAlone := taken("alone, once none ran", alone)
	fourth := turn(turnShared)
	waits("fourth beside one alone", fourth)
	endAlone()
	taken("fourth, once the one alone ended", fourth)()

	t.Setenv("TEST_DATABASE_URL", "")
	t.Setenv("DATABASE_URL", "")
	taken("without a shared server", turn(turnAlone))()
	t.Setenv("TEST_DATABASE_URL", c.URL("postgres"))
	held := taken("alone again", turn(turnAlone))
	defer held()
	taken("the kit's, which takes no turn", turn(turnNone))()
}
