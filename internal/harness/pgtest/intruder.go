package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/migrate"
)

// WithIntruder returns the URL of a fresh database migrated with pglimit's
// schema and migrations (as URL does), and the URL of the same database as
// an intruder: a role of its own, made for this test, that may connect to
// the database and has no other grant (no USAGE on the schema pglimit),
// as a database user of the host's that is not pglimit's owner (the
// reference service's console role) has. Such a role may LISTEN, NOTIFY
// and take advisory locks. Where the tests' server may not create roles
// (a DATABASE_URL role with CREATEDB alone), both are on a throwaway
// cluster of this test's own. The role is dropped when the test ends.
func WithIntruder(t TB, migrations ...Migration) (owner, intruder string) {
	t.Helper()
	s := theServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var may bool
	if err := s.admin.QueryRow(ctx, `SELECT rolsuper OR rolcreaterole FROM pg_roles WHERE rolname = current_user`).Scan(&may); err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	admin := s.admin
	if may {
		owner = URL(t, migrations...)
	} else {
		c := Cluster(t)
		admin = Pool(t, c.URL("postgres"), 1)
		for _, stmt := range []string{`CREATE ROLE service LOGIN`, `CREATE DATABASE app OWNER service`,
			`REVOKE CONNECT, TEMPORARY ON DATABASE app FROM PUBLIC`} {
			if _, err := admin.Exec(ctx, stmt); err != nil {
				t.Fatalf("pgtest: %v", err)
			}
		}
		owner = strings.Replace(c.URL("app"), "postgres@", "service@", 1)
		app := Pool(t, owner, 2)
		for _, m := range append([]Migration{Limits()}, migrations...) {
			if err := migrate.Apply(ctx, app, m.migration()); err != nil {
				t.Fatalf("pgtest: migrate: %v", err)
			}
		}
		app.Close()
	}
	parsed, err := url.Parse(owner)
	if err != nil {
		t.Fatalf("pgtest: %v", err)
	}
	database := strings.TrimPrefix(parsed.Path, "/")
	var buf [8]byte
	_, _ = rand.Read(buf[:])
	role := "pglimit_intruder_" + hex.EncodeToString(buf[:4])
	password := hex.EncodeToString(buf[4:])
	r, db := pgx.Identifier{role}.Sanitize(), pgx.Identifier{database}.Sanitize()
	// DDL: names and the password cannot be parameters.
	for _, stmt := range []string{
		`CREATE ROLE ` + r + ` LOGIN PASSWORD '` + password + `' NOSUPERUSER NOCREATEDB NOCREATEROLE`,
		`GRANT CONNECT ON DATABASE ` + db + ` TO ` + r,
	} {
		if _, err := admin.Exec(ctx, stmt); err != nil {
			t.Fatalf("pgtest: intruder: %v", err)
		}
	}
	t.Cleanup(func() { dropRole(t, admin, role, database) })
	parsed.User = url.UserPassword(role, password)
	return owner, parsed.String()
}

// dropRole ends the sessions of role (made by this test) in database, takes
// back its grant and drops it.
func dropRole(t TB, admin *pgxpool.Pool, role, database string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, db := pgx.Identifier{role}.Sanitize(), pgx.Identifier{database}.Sanitize()
	// Only this test's role's sessions, in this test's database.
	if _, err := admin.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = $1 AND datname = $2`,
		role, database); err != nil {
		t.Logf("pgtest: intruder sessions: %v", err)
	}
	for _, stmt := range []string{`REVOKE ALL ON DATABASE ` + db + ` FROM ` + r, `DROP ROLE ` + r} {
		var err error
		for try := 0; try < 50; try++ { // a terminated session may take a moment to go
			if _, err = admin.Exec(ctx, stmt); err == nil {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Logf("pgtest: intruder %s: %v", role, err)
			return
		}
	}
}
