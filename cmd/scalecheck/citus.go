package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/citustest"
)

// CitusRun is the operations measured again on a Citus cluster.
type CitusRun struct {
	// Version is Citus' version; Workers the number of worker nodes.
	Version string
	Workers int
	// Ops are the operations, as on one server, sent to the coordinator;
	// each one's CPU.Nodes holds the coordinator's CPU, then each
	// worker's.
	Ops []OpResult
	// OnWorkers are the same operations sent to the workers instead, each
	// replica's pool to one worker (Citus runs a statement from any node
	// with its metadata: on the node that holds the key's shard, locally;
	// on the other, forwarded to it).
	OnWorkers []OpResult
}

// OnWorker returns the result of the operation name at the given clients,
// sent to the workers.
func (c *CitusRun) OnWorker(name string, clients int) (OpResult, bool) {
	return findOp(c.OnWorkers, name, clients)
}

// Op returns the result of the operation name at the given clients.
func (c *CitusRun) Op(name string, clients int) (OpResult, bool) { return findOp(c.Ops, name, clients) }

// NodePerOp is the CPU one operation cost node i (0: the coordinator).
func (r OpResult) NodePerOp(i int) time.Duration {
	if r.Ops == 0 || i >= len(r.CPU.Nodes) {
		return 0
	}
	return r.CPU.Nodes[i] / time.Duration(r.Ops)
}

// WorkersPerOp is the CPU one operation cost the workers together.
func (r OpResult) WorkersPerOp() time.Duration {
	var sum time.Duration
	for i := 1; i < len(r.CPU.Nodes); i++ {
		sum += r.CPU.Nodes[i]
	}
	if r.Ops == 0 {
		return 0
	}
	return sum / time.Duration(r.Ops)
}

// onCitus starts a throwaway Citus cluster (a coordinator and two workers,
// internal/harness/citustest, fsync on as the one server's), migrates it (the limit
// tables distributed) and measures every operation there, through the
// coordinator, counting the CPU of every node.
func (e *env) onCitus(ctx context.Context) (*CitusRun, error) {
	if ok, line := citustest.Installed(); !ok {
		return nil, errors.New(line)
	}
	e.logf("-citus: starting a Citus cluster (a coordinator and two workers, fsync on)")
	cluster, err := citustest.Start(ctx, citustest.Options{Settings: map[string]string{
		"fsync": "on", "full_page_writes": "on",
	}})
	if err != nil {
		return nil, fmt.Errorf("citus: %w", err)
	}
	defer func() { _ = cluster.Stop() }()
	ce := &env{cfg: e.cfg, url: cluster.URL("postgres"), appName: e.appName + "-citus", run: e.run + "c",
		quiet: e.quiet, progress: e.progress, errors: map[string]string{}}
	oc, err := pgxpool.ParseConfig(ce.url)
	if err != nil {
		return nil, err
	}
	oc.MaxConns = 2
	oc.ConnConfig.RuntimeParams["application_name"] = ce.appName + "-observer"
	if ce.observer, err = pgxpool.NewWithConfig(ctx, oc); err != nil {
		return nil, err
	}
	defer ce.observer.Close()
	if err := pglimit.Migrate(ctx, ce.observer); err != nil {
		return nil, fmt.Errorf("migrate on citus: %w", err)
	}
	run := &CitusRun{Workers: len(cluster.WorkerURLs("postgres"))}
	if err := ce.observer.QueryRow(ctx, "SELECT extversion FROM pg_extension WHERE extname = 'citus'").Scan(&run.Version); err != nil {
		return nil, err
	}
	if ce.cpu, err = newCPUMeter(ctx, ce.observer, ce.appName, true); err != nil {
		return nil, err
	}
	for _, url := range cluster.WorkerURLs("postgres") {
		wc, err := pgxpool.ParseConfig(url)
		if err != nil {
			return nil, err
		}
		wc.MaxConns = 1
		wp, err := pgxpool.NewWithConfig(ctx, wc)
		if err != nil {
			return nil, err
		}
		defer wp.Close()
		m, err := newCPUMeter(ctx, wp, ce.appName, true)
		if err != nil {
			return nil, err
		}
		ce.cpu.nodes = append(ce.cpu.nodes, m)
	}
	if err := ce.openPools(ctx); err != nil {
		return nil, err
	}
	defer ce.closePools()
	run.Ops, err = ce.throughput(ctx)
	ce.closePools()
	if err == nil {
		e.logf("-citus: the same operations sent to the workers, each replica to one")
		ce.replicaURLs = cluster.WorkerURLs("postgres")
		ce.run += "w" // keys of their own: the upload windows above are full
		if err = ce.openPools(ctx); err == nil {
			run.OnWorkers, err = ce.throughput(ctx)
		}
	}
	for op, msg := range ce.errors {
		e.noteError(citusName(op), errors.New(msg))
	}
	return run, err
}

// citusName is the name an operation's error is kept under on Citus.
func citusName(op string) string { return "on citus: " + op }
