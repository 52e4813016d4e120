package main

import (
	"context"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/harness/activity"
)

// peaks are the most console statements the observer saw running at once.
type peaks struct {
	User, Installation, Token int
	// UserName and TokenName are where the peaks were first seen.
	UserName, TokenName string
	Samples             int
	// Interval is the mean time between two samples.
	Interval time.Duration
}

// observer polls pg_stat_activity (harness/activity) for the console
// statements of the run, whose SQL text carries "<marker><user>:<token>'".
// An observer that may not read the statements of every role in the
// database (a console role it is no member of, without pg_read_all_stats)
// stops the run with an error rather than report peaks of 0. A statement is active
// only while its request holds its heavy permit and its in-flight slot, so
// the counts it sees are at most the slots really held: more than a limit
// is an over-grant, never an artefact of sampling.
type observer struct {
	conn   *pgx.Conn
	marker string

	mu sync.Mutex
	p  peaks
}

func newObserver(ctx context.Context, url, marker string) (*observer, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	return &observer{conn: conn, marker: marker}, nil
}

// run samples until ctx ends, as often as the database answers (at most
// every millisecond).
func (o *observer) run(ctx context.Context) error {
	defer o.conn.Close(context.Background())
	start := time.Now()
	for ctx.Err() == nil {
		texts, err := activity.Running(ctx, o.conn, o.marker)
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
