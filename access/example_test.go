package access_test

import (
	"context"
	"fmt"
	"log"
	"net/netip"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/access"
)

// Deny a range of addresses for an hour, allow one user, and match
// requests against the lists: in memory, with no statement.
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
	rules, err := access.New(ctx, pool, access.Options{})
	if err != nil {
		log.Fatal(err)
	}
	go func() { _ = rules.Run(ctx) }() // reload on every change of any replica; pglimit.Run runs the bus

	deny, err := rules.Add(ctx, access.Rule{List: access.Deny, Match: "198.51.100.7/24", ExpiresIn: time.Hour})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := rules.Add(ctx, access.Rule{List: access.Allow, Match: "user:ops-bot"}); err != nil {
		log.Fatal(err)
	}
	_, err = rules.Add(ctx, access.Rule{List: access.Deny, Match: "10.0.0.0/33"})
	fmt.Println(err)
	fmt.Println(deny.List, deny.Match)

	fmt.Println(rules.Match(netip.MustParseAddr("198.51.100.20")))
	fmt.Println(rules.Match(netip.MustParseAddr("192.0.2.1"), "user:ops-bot"))
	fmt.Println(rules.Match(netip.MustParseAddr("198.51.100.20"), "user:ops-bot")) // deny wins
	fmt.Println(rules.Match(netip.MustParseAddr("192.0.2.1"), "user:someone"))
	// Output:
	// access: rule match: "10.0.0.0/33" is not a CIDR (address/length, the length at most 32 for IPv4, 128 for IPv6)
	// deny 198.51.100.0/24
	// deny
	// allow
	// deny
	// none
}
