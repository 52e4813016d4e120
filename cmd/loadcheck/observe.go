package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/activity"
)

// peaks are the most console statements the observer saw running at once.
type peaks struct {
	User, Installation, Token int
	// UserName and TokenName are where the peaks were first seen.
	UserName, TokenName string
	Samples             int
	// Nodes is the number of servers polled (a Citus cluster's nodes).
	Nodes int
	// Interval is the mean time between two samples.
	Interval time.Duration
}

// observer polls pg_stat_activity (internal/harness/activity) for the console
// statements of the run, whose SQL text carries "<marker><user>:<token>'".
// On a Citus coordinator it polls every node of pg_dist_node too and sums
// what each saw (the console statements, which read no distributed table,
// run on the coordinator; a count summed over nodes polled one after the
// other can only be higher than what ran at once, never hide an excess).
// An observer that may not read the statements of every role in the
// database (a console role it is no member of, without pg_read_all_stats)
// stops the run with an error rather than report peaks of 0. A statement is active
// only while its request holds its heavy permit and its in-flight slot, so
// the counts it sees are at most the slots really held: more than a limit
// is an over-grant, never an artefact of sampling.
type observer struct {
	conns  []*pgx.Conn
	marker string

	mu sync.Mutex
	p  peaks
}

func newObserver(ctx context.Context, url, marker string) (*observer, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	o := &observer{conns: []*pgx.Conn{conn}, marker: marker}
	nodes, err := citusNodes(ctx, conn)
	if err != nil {
		o.close()
		return nil, err
	}
	for _, n := range nodes {
		cfg := conn.Config().Copy()
		cfg.Host, cfg.Port, cfg.Fallbacks = n.host, n.port, nil
		c, err := pgx.ConnectConfig(ctx, cfg)
		if err != nil {
			o.close()
			return nil, fmt.Errorf("citus node %s:%d: %w", n.host, n.port, err)
		}
		o.conns = append(o.conns, c)
	}
	return o, nil
}

type node struct {
	host string
	port uint16
}

// citusNodes returns the worker nodes of a Citus coordinator (none on plain
// PostgreSQL).
func citusNodes(ctx context.Context, conn *pgx.Conn) ([]node, error) {
	var citus bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('pg_catalog.pg_dist_node') IS NOT NULL`).Scan(&citus); err != nil || !citus {
		return nil, err
	}
	rows, err := conn.Query(ctx, `SELECT nodename, nodeport FROM pg_dist_node
		WHERE isactive AND noderole = 'primary' AND groupid <> 0 ORDER BY nodeid`)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (node, error) {
		var n node
		var port int32
		err := r.Scan(&n.host, &port)
		n.port = uint16(port)
		return n, err
	})
}

func (o *observer) close() {
	for _, c := range o.conns {
		_ = c.Close(context.Background())
	}
}

// run samples until ctx ends, as often as the database answers (at most
// every millisecond).
func (o *observer) run(ctx context.Context) error {
	defer o.close()
	start := time.Now()
	for ctx.Err() == nil {
		var texts []string
		var err error
		for _, c := range o.conns {
			var some []string
			if some, err = activity.Running(ctx, c, o.marker); err != nil {
				break
			}
			texts = append(texts, some...)
		}
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			return err
		}
		users := map[string]int{}
		tokens := map[string]int{}
		total := 0
		for _, q := range texts {
			user, token, ok := parseMarker(q, o.marker)
			if !ok {
				continue
			}
			users[user]++
			tokens[token]++
			total++
		}
		o.mu.Lock()
		o.p.Samples++
		o.p.Nodes = len(o.conns)
		o.p.Installation = max(o.p.Installation, total)
		for u, n := range users {
			if n > o.p.User {
				o.p.User, o.p.UserName = n, u
			}
		}
		for t, n := range tokens {
			if n > o.p.Token {
				o.p.Token, o.p.TokenName = n, t
			}
		}
		o.mu.Unlock()
		select {
		case <-ctx.Done():
		case <-time.After(time.Millisecond):
		}
	}
	o.mu.Lock()
	if o.p.Samples > 0 {
		o.p.Interval = time.Since(start) / time.Duration(o.p.Samples)
	}
	o.mu.Unlock()
	return nil
}

// peaks returns the peaks so far.
func (o *observer) peaks() peaks {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.p
}

// parseMarker finds "<marker><user>:<token>'" in a statement's text.
func parseMarker(q, marker string) (user, token string, ok bool) {
	i := strings.Index(q, marker)
	if i < 0 {
		return "", "", false
	}
	rest := q[i+len(marker):]
	end := strings.IndexByte(rest, '\'')
	if end < 0 {
		return "", "", false
	}
	user, token, ok = strings.Cut(rest[:end], ":")
	if !ok || user == "" || token == "" {
		return "", "", false
	}
	return user, token, true
}
