// Package citustest starts a throwaway Citus cluster — a coordinator and
// workers, each a PostgreSQL server started by internal/harness/embedpg from the
// installed server binaries with shared_preload_libraries = 'citus' — for
// the tests that prove pglimit on Citus. It needs Citus built and
// installed for that PostgreSQL (../shared/citus/build, as root);
// Installed says in one line whether it is, so a test can skip with it.
//
// Start runs CREATE EXTENSION citus on every node, registers the
// coordinator (citus_set_coordinator_host) and adds the workers
// (citus_add_node) in the database "postgres"; CreateDatabase does the same
// for another database. Every node listens on loopback with trust
// authentication, as embedpg's servers do, and is removed by Stop.
package citustest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/embedpg"
)

// Installed reports whether Citus is installed for the PostgreSQL server
// binaries embedpg runs, and says so in one line either way (where it
// looked, and how to get it when it is not there).
func Installed() (bool, string) {
	in, err := embedpg.Installed()
	if err != nil {
		return false, err.Error()
	}
	so := filepath.Join(in.Lib, "citus.so")
	if _, err := os.Stat(so); err != nil {
		return false, fmt.Sprintf("citustest: Citus is not installed for the PostgreSQL of %s (no %s); build and install it with ../shared/citus/build as root", in.Bin, so)
	}
	version := ""
	if in.Share != "" {
		if b, err := os.ReadFile(filepath.Join(in.Share, "extension", "citus.control")); err == nil {
			for _, line := range strings.Split(string(b), "\n") {
				if v, ok := strings.CutPrefix(strings.TrimSpace(line), "default_version"); ok {
					version = " " + strings.Trim(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), "=")), "'")
				}
			}
		}
	}
	return true, fmt.Sprintf("citustest: Citus%s is installed for the PostgreSQL of %s (%s)", version, in.Bin, so)
}

// Options configure a cluster. The zero value is ready to use.
type Options struct {
	// Workers is the number of worker nodes. Default 2.
	Workers int
	// Settings are extra postgresql.conf settings of every node, on top of
	// embedpg's defaults and shared_preload_libraries = 'citus' and
	// citus.node_conninfo = 'sslmode=disable' (the nodes talk over
	// loopback).
	Settings map[string]string
	// Log receives every node's server output. Default: discarded.
	Log io.Writer
}

// Cluster is a running Citus cluster.
type Cluster struct {
	// Coordinator is the node clients connect to.
	Coordinator *embedpg.Cluster
	// Workers hold the shards of distributed tables.
	Workers []*embedpg.Cluster
}

// URL returns the connection string of database on the coordinator.
func (c *Cluster) URL(database string) string { return c.Coordinator.URL(database) }

// WorkerURLs returns the connection strings of database on each worker.
func (c *Cluster) WorkerURLs(database string) []string {
	urls := make([]string, len(c.Workers))
	for i, w := range c.Workers {
		urls[i] = w.URL(database)
	}
	return urls
}

// Nodes returns the coordinator followed by the workers.
func (c *Cluster) Nodes() []*embedpg.Cluster {
	return append([]*embedpg.Cluster{c.Coordinator}, c.Workers...)
}

// Start starts a coordinator and opts.Workers workers (concurrently), and
// makes a Citus cluster of them in the database "postgres". On an error
// every node started is stopped again.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	if ok, line := Installed(); !ok {
		return nil, errors.New(line)
	}
	n := opts.Workers
	if n <= 0 {
		n = 2
	}
	settings := map[string]string{
		"shared_preload_libraries": "citus",
		"citus.node_conninfo":      "sslmode=disable",
	}
	for k, v := range opts.Settings {
		settings[k] = v
	}
	nodes := make([]*embedpg.Cluster, n+1)
	errs := make([]error, n+1)
	var wg sync.WaitGroup
	for i := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nodes[i], errs[i] = embedpg.Start(ctx, embedpg.Options{Settings: settings, Log: opts.Log})
		}()
	}
	wg.Wait()
	c := &Cluster{Coordinator: nodes[0], Workers: nodes[1:]}
	if err := errors.Join(errs...); err != nil {
		_ = c.Stop()
		return nil, fmt.Errorf("citustest: %w", err)
	}
	if err := c.setup(ctx, "postgres"); err != nil {
		_ = c.Stop()
		return nil, err
	}
	return c, nil
}

// CreateDatabase creates database name on every node and makes a Citus
// cluster of it as Start does of "postgres" (Citus' metadata belongs to a
// database: a new one has no nodes until they are added in it).
func (c *Cluster) CreateDatabase(ctx context.Context, name string) error {
	for _, n := range c.Nodes() {
		if err := execOn(ctx, n.URL("postgres"), "CREATE DATABASE "+pgx.Identifier{name}.Sanitize()); err != nil {
			return err
		}
	}
	return c.setup(ctx, name)
}

// setup runs CREATE EXTENSION citus on every node's database, then, on the
// coordinator, citus_set_coordinator_host and citus_add_node per worker.
func (c *Cluster) setup(ctx context.Context, database string) error {
	for _, n := range c.Nodes() {
		if err := execOn(ctx, n.URL(database), "CREATE EXTENSION IF NOT EXISTS citus"); err != nil {
			return err
		}
	}
	stmts := []string{fmt.Sprintf("SELECT citus_set_coordinator_host('127.0.0.1', %d)", c.Coordinator.Port)}
	for _, w := range c.Workers {
		stmts = append(stmts, fmt.Sprintf("SELECT citus_add_node('127.0.0.1', %d)", w.Port))
	}
	for _, s := range stmts {
		if err := execOn(ctx, c.Coordinator.URL(database), s); err != nil {
			return err
		}
	}
	return nil
}

func execOn(ctx context.Context, url, sql string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return fmt.Errorf("citustest: %w", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql); err != nil {
		return fmt.Errorf("citustest: %s on %s: %w", sql, url, err)
	}
	return nil
}

// Stop stops every node and removes its data directory.
func (c *Cluster) Stop() error {
	var errs []error
	for _, n := range c.Nodes() {
		if n != nil {
			errs = append(errs, n.Stop())
		}
	}
	return errors.Join(errs...)
}
