package app

import (
	"net/http"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/middleware/heavy"
)

type flowEdge struct {
	Source   string `json:"source"`
	Target   string `json:"target"`
	Messages int64  `json:"messages"`
}

type flowResponse struct {
	Nodes  []string   `json:"nodes"`
	Edges  []flowEdge `json:"edges"`
	MayLag bool       `json:"mayLag"`
	Bound  *string    `json:"bound"`
}

// handleFlow answers the flow graph (GET /api/flow): messages between
// addresses, summed over ?from= and ?to=, the busiest pairs first. The
// row cap (-flow-rows) bounds the edges: the database returns one more
// than the cap (LIMIT), and a graph cut at the cap says bound "ROWS"; the
// time bound stops the aggregation (503 heavy-request-timed-out).
func (a *App) handleFlow(w http.ResponseWriter, r *http.Request) {
	from, to, ok := timeRange(w, r)
	if !ok {
		return
	}
	ctx := r.Context()
	b, _ := heavy.FromContext(ctx)
	var rows []*studiodb.MessageFlowGraphRow
	lag, err := a.readBounded(ctx, func(tx pgx.Tx) error {
		var err error
		rows, err = a.q.MessageFlowGraph(ctx, tx, &studiodb.MessageFlowGraphParams{Since: from, Until: to, Cap: int32(b.Rows + 1)})
		return err
	})
	if err != nil {
		a.heavyError(w, r, err)
		return
	}
	resp := flowResponse{Nodes: []string{}, Edges: make([]flowEdge, 0, len(rows)), MayLag: lag}
	if len(rows) > b.Rows {
		rows = rows[:b.Rows]
		bound := heavy.BoundRows
		resp.Bound = &bound
	}
	seen := map[string]bool{}
	for _, row := range rows {
		resp.Edges = append(resp.Edges, flowEdge{Source: row.SourceAddress, Target: row.TargetAddress, Messages: row.Messages})
		for _, n := range []string{row.SourceAddress, row.TargetAddress} {
			if !seen[n] {
				seen[n] = true
				resp.Nodes = append(resp.Nodes, n)
			}
		}
	}
	writeJSON(w, http.StatusOK, resp)
}
