// Command sqlcvet runs `sqlc vet` (rule sqlc/db-prepare: every query is
// prepared by a live PostgreSQL) against a fresh database migrated with
// pglimit's schema and the reference service's. The server is DATABASE_URL
// when set, else a throwaway cluster; the database is dropped afterwards.
// `make verify` runs it after `sqlc diff`.
package main

import (
	"context"
	"fmt"
	"github.com/pglimit/pglimit"
	"os"
	"os/exec"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/internal/harness/embedpg"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "sqlcvet:", err)
		os.Exit(1)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	server := os.Getenv("DATABASE_URL")
	if server == "" {
		c, err := embedpg.Start(ctx, embedpg.Options{})
		if err != nil {
			return err
		}
		defer c.Stop()
		server = c.URL("postgres")
	}
	admin, err := pgxpool.New(ctx, server)
	if err != nil {
		return err
	}
	defer admin.Close()
	name := fmt.Sprintf("pglimit_sqlcvet_%d", os.Getpid())
	if _, err := admin.Exec(ctx, "CREATE DATABASE "+name); err != nil {
		return err
	}
	defer admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)")
	url := pgtest.WithDatabase(server, name)
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		return err
	}
	err = pglimit.Migrate(ctx, pool)
	if err == nil {
		err = studioschema.Apply(ctx, pool)
	}
	pool.Close()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "tool", "sqlc", "vet")
	cmd.Env = append(os.Environ(), "PGLIMIT_VET_URL="+url)
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("sqlc vet: %w", err)
	}
	fmt.Println("sqlc vet: every query prepared against a live, migrated database")
	return nil
}
