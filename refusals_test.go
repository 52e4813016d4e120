package pglimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestRefusals reads rows of pglimit.refusal_minute back by limit and
// minute, refused and dry-run-refused apart, the current minute last, and
// refuses a span outside 1..60 minutes.
func TestRefusals(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	ctx := context.Background()
	// The rows are written for the database's current minute; a read in
	// the next minute sees them shifted, so it writes and reads again.
	var m *pglimit.RefusalMinutes
	for try := 0; ; try++ {
		if _, err := pool.Exec(ctx, `TRUNCATE pglimit.refusal_minute`); err != nil {
			t.Fatal(err)
		}
		var written time.Time
		if err := pool.QueryRow(ctx, `INSERT INTO pglimit.refusal_minute (name, minute, dry_run, refusals, expires_at)
			VALUES ('api', date_trunc('minute', now()), false, 3, now() + interval '1 hour'),
			       ('api', date_trunc('minute', now()) - interval '1 minute', true, 2, now() + interval '1 hour'),
			       ('old', date_trunc('minute', now()) - interval '10 minutes', false, 7, now() + interval '1 hour')
			RETURNING date_trunc('minute', now())`).Scan(&written); err != nil {
			t.Fatal(err)
		}
		var err error
		if m, err = pglimit.Refusals(ctx, pool, 5); err != nil {
			t.Fatal(err)
		}
		if len(m.Minutes) == 0 || m.Minutes[len(m.Minutes)-1].Equal(written) || try == 2 {
			break
		}
	}
	if len(m.Minutes) != 5 || !m.Minutes[4].After(m.Minutes[3]) {
		t.Fatalf("Minutes = %v, want 5, oldest first", m.Minutes)
	}
	if got := m.Refused["api"]; len(got) != 5 || got[4] != 3 || got[3] != 0 {
		t.Errorf("Refused[api] = %v, want 3 in the current minute", got)
	}
	if got := m.DryRunRefused["api"]; len(got) != 5 || got[3] != 2 || got[4] != 0 {
		t.Errorf("DryRunRefused[api] = %v, want 2 in the minute before", got)
	}
	if _, ok := m.Refused["old"]; ok {
		t.Errorf("Refused has %q, which refused only 10 minutes ago", "old")
	}
	for _, n := range []int{0, 61} {
		if _, err := pglimit.Refusals(ctx, pool, n); err == nil {
			t.Errorf("Refusals(%d minutes) = nil error", n)
		}
	}
}
