package app

import (
	"context"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/crypto/bcrypt"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
)

// DemoSet is the demo data of REFERENCE-SERVICE.md.
type DemoSet struct {
	Users     []string // each with password Password and token <name>-token
	Operators []string // the users among Users who are operators
	Password  string
	// NumberedUsers more users user00001… (password Password, token
	// <user>-token) for load runs (-demo-users).
	NumberedUsers int
	AuditEvents   int
	Events        int
	Alerts        int
	FlowRows      int
}

// DemoData is alice, bob and carol (password "studio", tokens alice-token,
// bob-token, carol-token; alice is an operator), 100,000 audit events, 10,000 events, 10,000
// alerts and 5,000 message-flow rows.
func DemoData() DemoSet {
	return DemoSet{
		Users:       []string{"alice", "bob", "carol"},
		Operators:   []string{"alice"},
		Password:    "studio",
		AuditEvents: 100000,
		Events:      10000,
		Alerts:      10000,
		FlowRows:    5000,
	}
}

// Seed writes the demo data once. Replicas starting together take turns
// on an advisory lock, and the one that finds the data set marked as
// seeded writes no history again; the users and their tokens are brought
// up to date on every start (an upsert), so a database seeded by an older
// version gets its operator.
func Seed(ctx context.Context, pool *pgxpool.Pool, d DemoSet) error {
	const name = "demo-v1"
	hash, err := bcrypt.GenerateFromPassword([]byte(d.Password), bcrypt.DefaultCost)
	if err != nil {
		return err
	}
	q := studiodb.New()
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := q.SeedLock(ctx, tx); err != nil {
			return err
		}
		if d.NumberedUsers > 0 {
			if err := q.SeedNumberedUsers(ctx, tx, &studiodb.SeedNumberedUsersParams{PasswordHash: string(hash), N: int32(d.NumberedUsers)}); err != nil {
				return err
			}
		}
		for _, u := range d.Users {
			id, err := q.SeedUser(ctx, tx, &studiodb.SeedUserParams{Username: u, PasswordHash: string(hash), Operator: slices.Contains(d.Operators, u)})
			if err != nil {
				return err
			}
			if err := q.SeedToken(ctx, tx, &studiodb.SeedTokenParams{Digest: TokenDigest(u + "-token"), UserID: id, Name: "demo"}); err != nil {
				return err
			}
		}
		done, err := q.SeedDone(ctx, tx, name)
		if err != nil || done {
			return err
		}
		for _, step := range []func() error{
			func() error { return q.SeedAuditEvents(ctx, tx, int32(d.AuditEvents)) },
			func() error { return q.SeedEvents(ctx, tx, int32(d.Events)) },
			func() error { return q.SeedAlerts(ctx, tx, int32(d.Alerts)) },
			func() error { return q.SeedMessageFlow(ctx, tx, int32(d.FlowRows)) },
		} {
			if err := step(); err != nil {
				return err
			}
		}
		return q.SeedMark(ctx, tx, name)
	})
}
