package app

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/cmd/internal/jolokia"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/problem"
)

// setupNodes makes the node call limiter (the rate of each node divided by
// the ready replicas of the registry) and a Jolokia client per -node.
func (a *App) setupNodes() error {
	var err error
	a.nodeLimit, err = nodelimit.New(nodelimit.Options{
		Rate: rate.Limit(a.cfg.NodeRate),
		// The ready count as the limiter last read it, for the queue
		// listing's rate.readyReplicas.
		Replicas: func(ctx context.Context) (int, error) {
			n, err := a.registry.ReadyReplicas(ctx)
			if err == nil {
				a.readyReplicas.Store(int64(n))
			}
			return n, err
		},
		MeterProvider: a.meters,
		Logger:        a.log,
	})
	if err != nil {
		return err
	}
	a.nodes = map[string]*jolokia.Client{}
	for name, url := range a.cfg.Nodes {
		gate, err := a.nodeLimit.Node(name)
		if err != nil {
			return err
		}
		c, err := jolokia.New(url, gate, jolokia.Options{Timeout: 10 * time.Second, MeterProvider: a.meters})
		if err != nil {
			return err
		}
		a.nodes[name] = c
	}
	return nil
}

type queuesResponse struct {
	Node   string          `json:"node"`
	Queues []jolokia.Queue `json:"queues"`
	Rate   map[string]any  `json:"rate"`
}

// handleQueues lists a node's queues with MessageCount and ConsumerCount
// (GET /api/nodes/{node}/queues), read through Jolokia: one search call and
// one read call per 200 queues, each waiting its turn at this replica's
// share of the node's rate.
func (a *App) handleQueues(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("node")
	client, ok := a.nodes[name]
	if !ok {
		problem.Write(w, &problem.Details{Slug: "unknown-node", Title: "Unknown node", Status: http.StatusNotFound,
			Detail: "No broker node of that name is configured.", Instance: r.URL.Path})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 30*time.Second)
	defer cancel()
	queues, err := client.Queues(ctx)
	if err != nil {
		jolokia.WriteError(w, r, a.log, name, err)
		return
	}
	if queues == nil {
		queues = []jolokia.Queue{}
	}
	gate, _ := a.nodeLimit.Node(name)
	writeJSON(w, http.StatusOK, queuesResponse{Node: name, Queues: queues, Rate: map[string]any{
		"installation": float64(a.cfg.NodeRate), "replica": float64(gate.Limit()), "readyReplicas": a.readyReplicas.Load(),
	}})
}
