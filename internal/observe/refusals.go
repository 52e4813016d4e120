package observe

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/pglimit/pglimit/db"
)

// Why refusals per minute are kept in the database, and how it stays cheap.
//
// An operator of a replicated service asks how often each limit refuses,
// installation-wide. The metric pglimit.decisions answers per replica (a
// scraper sums the replicas); a page served by one replica must read the
// installation's numbers from somewhere all replicas write. So refusals
// are added to the UNLOGGED table pglimit.refusal_minute, one row per
// limit, minute and dry run (sql/queries/refusal_minute.sql).
//
// A granted request writes nothing there. A refusal is one increment in
// memory; a goroutine that lives only while there are refusals to write
// adds them in one upsert: the first at once, the next no sooner than
// flushSpacing later, carrying every refusal made meanwhile. A storm of
// refusals therefore costs each limiter of each replica about one small
// statement a second, not one per refusal. A write that fails keeps its
// count for the next; what a replica has not written when it dies is lost
// (at most flushSpacing of its refusals), as an UNLOGGED table loses its
// rows in a crash: the chart is for operators, the limits do not read it.

// flushSpacing is the least time between two writes of one limiter's
// refusals.
const flushSpacing = time.Second

// minuteCounter adds a limiter's refusals to pglimit.refusal_minute in
// batches.
type minuteCounter struct {
	db      db.DBTX
	q       *db.Queries
	name    string
	dryRun  bool
	timeout time.Duration
	spacing time.Duration
	log     *slog.Logger
	errLog  Sampled

	mu       sync.Mutex
	pending  int64
	flushing bool // a goroutine is writing, or waiting to
	last     time.Time
}

// add counts one refusal, and starts the writer when none runs.
func (c *minuteCounter) add() {
	c.mu.Lock()
	c.pending++
	if c.flushing {
		c.mu.Unlock()
		return
	}
	c.flushing = true
	c.mu.Unlock()
	go c.flush()
}

// flush writes the pending refusals, no sooner than spacing after the last
// write, until none are pending; it ends after a failed write (the count
// stays pending, and the next refusal starts a writer again).
func (c *minuteCounter) flush() {
	for {
		c.mu.Lock()
		wait := c.spacing - time.Since(c.last)
		c.mu.Unlock()
		if wait > 0 {
			time.Sleep(wait)
		}
		c.mu.Lock()
		n := c.pending
		c.pending, c.last = 0, time.Now()
		if n == 0 {
			c.flushing = false
			c.mu.Unlock()
			return
		}
		c.mu.Unlock()
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		err := c.q.RefusalMinuteAdd(ctx, c.db, &db.RefusalMinuteAddParams{Name: c.name, DryRun: c.dryRun, Refusals: n})
		cancel()
		if err != nil {
			c.mu.Lock()
			c.pending += n
			c.flushing = false
			c.mu.Unlock()
			level := slog.LevelWarn
			if strings.Contains(err.Error(), "closed pool") {
				level = slog.LevelDebug // the service is shutting down
			}
			c.errLog.Log(context.Background(), c.log, level,
				"pglimit: refusals per minute not written; they are kept for the next write", "limit", c.name, "refusals", n, "err", err)
			return
		}
	}
}

// Minutes are the refusals of every limit per minute, as Recent reads
// them.
type Minutes struct {
	// Minutes are the minutes read, oldest first, on the database clock;
	// the last is the current minute.
	Minutes []time.Time
	// Limits are the limits that refused in them, by name.
	Limits []LimitMinutes
}

// LimitMinutes are one limit's refusals per minute.
type LimitMinutes struct {
	Name string
	// Refused and DryRunRefused have one count per minute, as Minutes.
	Refused, DryRunRefused []int64
}

// Recent reads the refusals of the last n minutes (the current one
// included) from pglimit.refusal_minute.
func Recent(ctx context.Context, dbtx db.DBTX, n int) (*Minutes, error) {
	if n < 1 || n > 60 {
		return nil, fmt.Errorf("observe: %d minutes outside 1..60", n)
	}
	rows, err := db.New().RefusalMinuteRecent(ctx, dbtx, int32(n))
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("observe: refusals: no current minute")
	}
	out := &Minutes{}
	current := rows[0].CurrentMinute
	for i := n - 1; i >= 0; i-- {
		out.Minutes = append(out.Minutes, current.Add(-time.Duration(i)*time.Minute))
	}
	for _, r := range rows {
		if r.Name == nil || !r.Minute.Valid || r.Refusals == nil || r.DryRun == nil {
			continue
		}
		if len(out.Limits) == 0 || out.Limits[len(out.Limits)-1].Name != *r.Name {
			out.Limits = append(out.Limits, LimitMinutes{Name: *r.Name, Refused: make([]int64, n), DryRunRefused: make([]int64, n)})
		}
		lm := &out.Limits[len(out.Limits)-1]
		i := n - 1 - int(current.Sub(r.Minute.Time)/time.Minute)
		if i < 0 || i >= n {
			continue
		}
		if *r.DryRun {
			lm.DryRunRefused[i] += *r.Refusals
		} else {
			lm.Refused[i] += *r.Refusals
		}
	}
	return out, nil
}
