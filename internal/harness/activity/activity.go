// Package activity observes the statements running in a database through
// pg_stat_activity: the independent observer of the concurrency tests and
// of cmd/loadcheck, which counts what PostgreSQL itself runs rather than
// what pglimit's tables say.
//
// An observer sees the text of another role's statements only when its own
// role is a superuser, a member of that role, or a member of
// pg_read_all_stats; otherwise pg_stat_activity shows "<insufficient
// privilege>" in place of the text, and an observer that counted statements
// by their text would report none. Running detects that and returns a
// *BlindError instead, so a set-up that blinds the observer fails loudly.
//
// The statements here are the observer's own view of the database's
// catalog, not pglimit's: they are written here, not compiled by sqlc.
package activity

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what an observer reads through: a *pgx.Conn or a
// *pgxpool.Pool.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// hidden is the text pg_stat_activity shows in place of a statement the
// observer may not read.
const hidden = "<insufficient privilege>"

// sessionsQuery returns, for the current database and other than the
// observer's own session, the text of every statement carrying the marker
// whose session is in one of the states $2 (its current or last
// statement), and every session of a role (usesysid is set: not a
// background process such as autovacuum) whose text the observer may not
// read. The marker is a parameter, so the observer's own statement never
// matches itself.
const sessionsQuery = `SELECT query, usename, query = '` + hidden + `' AS hidden
FROM pg_stat_activity
WHERE datname = current_database() AND pid <> pg_backend_pid() AND usesysid IS NOT NULL
  AND ((state = ANY ($2::text[]) AND strpos(query, $1) > 0) OR query = '` + hidden + `')`

// BlindError says the observer cannot read the statements of some sessions
// of its database, so it cannot count what they run.
type BlindError struct {
	// Observer is the observer's role; Roles are the roles it cannot read.
	Observer string
	Roles    []string
}

func (e *BlindError) Error() string {
	return fmt.Sprintf("pg_stat_activity observer is blind: its role %q may not read the statements of role(s) %s in this database, so it would count them as none; "+
		"observe as a superuser or GRANT pg_read_all_stats TO %s",
		e.Observer, strings.Join(e.Roles, ", "), ident(e.Observer))
}

// ident is name as SQL writes it: bare when it can be, quoted otherwise.
func ident(name string) string {
	bare := name != ""
	for i, r := range name {
		if !(r == '_' || r >= 'a' && r <= 'z' || i > 0 && r >= '0' && r <= '9') {
			bare = false
		}
	}
	if bare {
		return name
	}
	return pgx.Identifier{name}.Sanitize()
}

// Running returns the text of every statement running now in q's database
// whose text contains marker (the observer's own excepted). It returns a
// *BlindError when a session of the database belongs to a role whose
// statements the observer may not read.
func Running(ctx context.Context, q Querier, marker string) ([]string, error) {
	return sessions(ctx, q, marker, "active")
}

// Holding is Running counting also the sessions whose last statement
// contains marker and whose transaction is still open (idle in
// transaction): what still holds the statement's locks and snapshot.
func Holding(ctx context.Context, q Querier, marker string) ([]string, error) {
	return sessions(ctx, q, marker, "active", "idle in transaction", "idle in transaction (aborted)", "fastpath function call")
}

func sessions(ctx context.Context, q Querier, marker string, states ...string) ([]string, error) {
	rows, err := q.Query(ctx, sessionsQuery, marker, states)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var texts, blind []string
	for rows.Next() {
		var text string
		var role *string
		var isHidden bool
		if err := rows.Scan(&text, &role, &isHidden); err != nil {
			return nil, err
		}
		if isHidden {
			name := ""
			if role != nil {
				name = *role
			}
			if !slices.Contains(blind, name) {
				blind = append(blind, name)
			}
			continue
		}
		texts = append(texts, text)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(blind) > 0 {
		me, err := currentUser(ctx, q)
		if err != nil {
			return nil, err
		}
		slices.Sort(blind)
		return nil, &BlindError{Observer: me, Roles: blind}
	}
	return texts, nil
}

func currentUser(ctx context.Context, q Querier) (string, error) {
	rows, err := q.Query(ctx, `SELECT current_user::text`)
	if err != nil {
		return "", err
	}
	return pgx.CollectExactlyOneRow(rows, pgx.RowTo[string])
}

// Watcher samples Running on a connection of its own, as often as the
// database answers, and keeps the most statements it saw at once.
type Watcher struct {
	conn   *pgx.Conn
	marker string
	quit   chan struct{}
	done   chan struct{}

	mu      sync.Mutex
	peak    int
	samples int
	err     error
}

// Watch connects to url and samples the statements carrying marker until
// Stop.
func Watch(ctx context.Context, url, marker string) (*Watcher, error) {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	w := &Watcher{conn: conn, marker: marker, quit: make(chan struct{}), done: make(chan struct{})}
	go w.run()
	return w, nil
}

func (w *Watcher) run() {
	defer close(w.done)
	defer w.conn.Close(context.Background())
	for {
		select {
		case <-w.quit:
			return
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		texts, err := Running(ctx, w.conn, w.marker)
		cancel()
		w.mu.Lock()
		if err != nil {
			// A blind observer, or one that lost its connection, has
			// nothing more to say: the first error is the answer.
			w.err = err
			w.mu.Unlock()
			return
		}
		w.samples++
		w.peak = max(w.peak, len(texts))
		w.mu.Unlock()
		select {
		case <-w.quit:
			return
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// Peak returns the most statements seen at once so far and the number of
// samples taken.
func (w *Watcher) Peak() (peak, samples int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peak, w.samples
}

// Stop ends the sampling and returns the most statements seen at once and
// the number of samples. The error is the one that stopped the sampling
// early (a *BlindError, or a lost connection); a peak then counts only what
// was seen before it. A watcher that took no sample says so.
func (w *Watcher) Stop() (peak, samples int, err error) {
	select {
	case <-w.quit:
	default:
		close(w.quit)
	}
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil && w.samples == 0 {
		return 0, 0, errors.New("activity: the observer took no sample")
	}
	return w.peak, w.samples, w.err
}
