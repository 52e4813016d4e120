package housekeep_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/internal/harness/observetest"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
	"github.com/pglimit/pglimit/internal/housekeep"
)

func TestMain(m *testing.M) { pgtest.MainWithExampleDatabase(m) }

// fill inserts lapsed and live rows in every limit table; row keys start
// with "lapsed-" or "live-".
func fill(t testing.TB, pool *pgxpool.Pool, lapsed, live int) {
	t.Helper()
	ctx := context.Background()
	for _, table := range []string{"heavy_permit", "request_in_flight", "upload_window"} {
		for kind, n := range map[string]int{"lapsed": lapsed, "live": live} {
			if n == 0 {
				continue
			}
			exp := "now() - interval '1 minute'"
			if kind == "live" {
				exp = "now() + interval '1 hour'"
			}
			if _, err := pool.Exec(ctx, fmt.Sprintf(`
				INSERT INTO pglimit.slot (kind, scope, slot, lease_id, holder, endpoint, replica, claimed_at, expires_at)
				SELECT '%s', '%s-' || g, 1, gen_random_uuid(), 'u', 'e', 'r', now() - interval '2 hours', %s
				FROM generate_series(1, $1) AS g`, table, kind, exp), n); err != nil {
				t.Fatal(err)
			}
		}
	}
	for kind, n := range map[string]int{"lapsed": lapsed, "live": live} {
		if n == 0 {
			continue
		}
		exp := "now() - interval '1 minute'"
		if kind == "live" {
			exp = "now() + interval '1 hour'"
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.login_attempt (key, failures, first_at, last_at, expires_at)
			SELECT '%s-' || g, 3, now() - interval '2 hours', now() - interval '2 hours', %s
			FROM generate_series(1, $1) AS g`, kind, exp), n); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.replica (name, started_at, heartbeat_at, ready, expires_at)
			SELECT '%s-' || g, now() - interval '2 hours', now() - interval '2 hours', true, %s
			FROM generate_series(1, $1) AS g`, kind, exp), n); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.api_request_window (name, key, policies, tats, allowed, decided_at, expires_at)
			SELECT 'api', '%s-' || g, '{api}', ARRAY[%s], true, now() - interval '2 hours', %s
			FROM generate_series(1, $1) AS g`, kind, exp, exp), n); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.refusal_minute (name, minute, dry_run, refusals, expires_at)
			SELECT '%s-' || g, date_trunc('minute', now()) - interval '2 hours', false, 1, %s
			FROM generate_series(1, $1) AS g`, kind, exp), n); err != nil {
			t.Fatal(err)
		}
		for _, table := range []string{"quota_usage", "quota_ledger"} {
			if _, err := pool.Exec(ctx, fmt.Sprintf(`
				INSERT INTO pglimit.%s (name, key, period_start, period_end, used, allowed, decided_at)
				SELECT 'q', '%s-' || g, now() - interval '1 day', %s, 1, true, now() - interval '2 hours'
				FROM generate_series(1, $1) AS g`, table, kind, exp), n); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.ban (key, refusals, first_at, last_at, until, banned_at, expires_at)
			SELECT '%s-' || g, 0, now() - interval '2 hours', now() - interval '2 hours', %s, now() - interval '2 hours', %s
			FROM generate_series(1, $1) AS g`, kind, exp, exp), n); err != nil {
			t.Fatal(err)
		}
		// The allow and deny lists' rules: a live one lapses in an hour
		// (one that never lapses is TestSweep's, in package housekeeping).
		if _, err := pool.Exec(ctx, fmt.Sprintf(`
			INSERT INTO pglimit.access_rule (list, match, created_at, expires_at)
			SELECT 'deny', '%s-' || g, now() - interval '2 hours', %s
			FROM generate_series(1, $1) AS g`, kind, exp), n); err != nil {
			t.Fatal(err)
		}
	}
}

// keys returns the row keys left in every table (for a kind of slot, its
// rows in pglimit.slot, lapsed ones included: the view shows live ones).
func keys(t testing.TB, pool *pgxpool.Pool) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for table, from := range map[string]string{
		"heavy_permit":       `SELECT scope FROM pglimit.slot WHERE kind = 'heavy_permit'`,
		"request_in_flight":  `SELECT scope FROM pglimit.slot WHERE kind = 'request_in_flight'`,
		"upload_window":      `SELECT scope FROM pglimit.slot WHERE kind = 'upload_window'`,
		"login_attempt":      `SELECT key FROM pglimit.login_attempt`,
		"replica":            `SELECT name FROM pglimit.replica`,
		"api_request_window": `SELECT key FROM pglimit.api_request_window`,
		"refusal_minute":     `SELECT name FROM pglimit.refusal_minute`,
		"quota_usage":        `SELECT key FROM pglimit.quota_usage`,
		"quota_ledger":       `SELECT key FROM pglimit.quota_ledger`,
		"ban":                `SELECT key FROM pglimit.ban`,
		"access_rule":        `SELECT match FROM pglimit.access_rule`,
	} {
		rows, err := pool.Query(context.Background(), from)
		if err != nil {
			t.Fatal(err)
		}
		ks, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		sort.Strings(ks)
		out[table] = ks
	}
	return out
}

func perTable(n int64) map[string]int64 {
	m := map[string]int64{}
	for _, table := range housekeep.Tables {
		m[table] = n
	}
	return m
}

func newHousekeeper(t testing.TB, pool *pgxpool.Pool, opts housekeep.Options) *housekeep.Housekeeper {
	t.Helper()
	h, err := housekeep.New(pool, opts)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// TestDeletesOnlyLapsedRows: with live and lapsed rows in every table, a
// sweep deletes exactly the lapsed ones, reports them per table in its
// Result, in the counter pglimit.housekeeping.deleted and in the log.
func TestDeletesOnlyLapsedRows(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	fill(t, pool, 3, 2)
	meter := observetest.New()
	var logs bytes.Buffer
	h := newHousekeeper(t, pool, housekeep.Options{
		MeterProvider: meter,
		Logger:        slog.New(slog.NewJSONHandler(&logs, nil)),
	})
	ctx := context.Background()
	res, err := h.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(housekeep.Result{Ran: true, Deleted: perTable(3)}, res); diff != "" {
		t.Fatalf("result (-want +got):\n%s", diff)
	}
	want := map[string][]string{}
	for _, table := range housekeep.Tables {
		want[table] = []string{"live-1", "live-2"}
	}
	if diff := cmp.Diff(want, keys(t, pool)); diff != "" {
		t.Fatalf("rows left (-want +got):\n%s", diff)
	}

	got := meter.Counts(t, housekeep.MetricDeleted, "table")
	if diff := cmp.Diff(perTable(3), got); diff != "" {
		t.Errorf("counter %s (-want +got):\n%s", housekeep.MetricDeleted, diff)
	}

	var line map[string]any
	if err := json.Unmarshal(logs.Bytes(), &line); err != nil {
		t.Fatalf("log %q: %v", logs.String(), err)
	}
	delete(line, "time")
	wantLine := map[string]any{"level": "INFO", "msg": "housekeeping: deleted lapsed rows", "total": float64(3 * len(housekeep.Tables))}
	for _, table := range housekeep.Tables {
		wantLine[table] = float64(3)
	}
	if diff := cmp.Diff(wantLine, line); diff != "" {
		t.Errorf("log line (-want +got):\n%s", diff)
	}

	// A second sweep finds nothing.
	res, err = h.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(housekeep.Result{Ran: true, Deleted: perTable(0)}, res); diff != "" {
		t.Fatalf("second sweep (-want +got):\n%s", diff)
	}
}

// deleteTracer records the rows each *DeleteLapsed statement deleted.
type deleteTracer struct {
	mu      sync.Mutex
	deletes map[string][]int64
}

type queryName struct{}

func (tr *deleteTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryStartData) context.Context {
	name := strings.TrimSpace(d.SQL)
	if rest, ok := strings.CutPrefix(name, "-- name: "); ok {
		name, _, _ = strings.Cut(rest, " ")
	}
	return context.WithValue(ctx, queryName{}, name)
}

func (tr *deleteTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, d pgx.TraceQueryEndData) {
	name, _ := ctx.Value(queryName{}).(string)
	if !strings.HasSuffix(name, "DeleteLapsed") {
		return
	}
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.deletes[name] = append(tr.deletes[name], d.CommandTag.RowsAffected())
}

// TestBatchesAreBounded: with a batch of 10 and 35 lapsed rows in every
// table, login_attempt, replica, api_request_window, refusal_minute,
// quota_usage, quota_ledger, ban and access_rule are swept by statements
// deleting 10, 10, 10 and 5 rows, and the three slot tables
// (105 rows, one statement on their parent) by 11 statements.
func TestBatchesAreBounded(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	fill(t, pgtest.Pool(t, url, 2), 35, 4)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	tr := &deleteTracer{deletes: map[string][]int64{}}
	cfg.ConnConfig.Tracer = tr
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	res, err := newHousekeeper(t, pool, housekeep.Options{Batch: 10}).RunOnce(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(housekeep.Result{Ran: true, Deleted: perTable(35)}, res); diff != "" {
		t.Fatalf("result (-want +got):\n%s", diff)
	}
	want := map[string][]int64{}
	for _, name := range []string{"LoginAttemptDeleteLapsed", "ReplicaDeleteLapsed", "APIRequestWindowDeleteLapsed", "RefusalMinuteDeleteLapsed", "QuotaUsageDeleteLapsed", "QuotaLedgerDeleteLapsed", "BanDeleteLapsed", "AccessRuleDeleteLapsed"} {
		want[name] = []int64{10, 10, 10, 5}
	}
	slots := tr.deletes["SlotDeleteLapsed"]
	delete(tr.deletes, "SlotDeleteLapsed")
	if len(slots) != 11 {
		t.Errorf("the slot tables took %d statements, want 11 (105 rows in batches of 10)", len(slots))
	}
	if diff := cmp.Diff(want, tr.deletes); diff != "" {
		t.Fatalf("rows per DELETE (-want +got):\n%s", diff)
	}
	for table, ks := range keys(t, pool) {
		if len(ks) != 4 {
			t.Errorf("%s: %d rows left, want the 4 live ones", table, len(ks))
		}
	}
}

// TestSkipsWhileTheLockIsHeld: another replica holding the lock makes a
// sweep skip its turn without touching a row; once it lets go, the sweep
// runs.
func TestSkipsWhileTheLockIsHeld(t *testing.T) {
	t.Parallel()
	pool, url := pgtest.NewDB(t, 2)
	fill(t, pool, 5, 1)
	ctx := context.Background()
	other, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close(ctx)
	if _, err := other.Exec(ctx, `SELECT pg_advisory_lock(1199, $1)`, housekeep.LockKey); err != nil {
		t.Fatal(err)
	}
	h := newHousekeeper(t, pool, housekeep.Options{})
	res, err := h.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(housekeep.Result{}, res); diff != "" {
		t.Fatalf("sweep while the lock is held (-want +got):\n%s", diff)
	}
	for table, ks := range keys(t, pool) {
		if len(ks) != 6 {
			t.Fatalf("%s: %d rows, want all 6 untouched", table, len(ks))
		}
	}
	if _, err := other.Exec(ctx, `SELECT pg_advisory_unlock(1199, $1)`, housekeep.LockKey); err != nil {
		t.Fatal(err)
	}
	res, err = h.RunOnce(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(housekeep.Result{Ran: true, Deleted: perTable(5)}, res); diff != "" {
		t.Fatalf("sweep after the lock was released (-want +got):\n%s", diff)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Fatalf("%d housekeeping locks held after the sweep", n)
	}
}

func advisoryLocks(t testing.TB, pool *pgxpool.Pool) int {
	t.Helper()
	var n int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1199 AND granted AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestOneReplicaAtATime: three replicas (three pools) sweep at the same
// moment, round after round, and an observer in the database sees their
// batches take turns: statement triggers log each DELETE of a limit table,
// before and after it, with its transaction and the database clock, and no
// two transactions' DELETEs overlap. Together the replicas delete exactly
// the lapsed rows, each once. (Whether a replica skips its turn or comes
// in between two batches of another and takes over the rest of the sweep
// depends on scheduling — the lock is per batch, so that it works through
// PgBouncer — so the test counts neither: TestSkipsWhileTheLockIsHeld
// covers the skip.)
func TestOneReplicaAtATime(t *testing.T) {
	t.Parallel()
	url := pgtest.URL(t)
	var hs []*housekeep.Housekeeper
	var pools []*pgxpool.Pool
	for i := 0; i < 3; i++ {
		p := pgtest.Pool(t, url, 2)
		pools = append(pools, p)
		hs = append(hs, newHousekeeper(t, p, housekeep.Options{Batch: 50}))
	}
	logDeletes(t, pools[0])
	const lapsed = 600
	for round := 0; round < 5; round++ {
		fill(t, pools[0], lapsed, 0)
		var (
			wg      sync.WaitGroup
			results = make([]housekeep.Result, 3)
			errs    = make([]error, 3)
			start   = make(chan struct{})
		)
		for i, h := range hs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				results[i], errs[i] = h.RunOnce(context.Background())
			}()
		}
		close(start)
		wg.Wait()
		deleters, ran := 0, 0
		var total int64
		for i, r := range results {
			if errs[i] != nil {
				t.Fatal(errs[i])
			}
			if r.Ran {
				ran++
			}
			if r.Total() > 0 {
				deleters++
			}
			total += r.Total()
		}
		batches, overlaps := deleteOverlaps(t, pools[0])
		t.Logf("round %d: %d sweeps ran, %d deleted, %d rows; %d batches so far", round, ran, deleters, total, batches)
		if overlaps != "" {
			t.Fatalf("round %d: the DELETEs of two transactions overlapped: %s", round, overlaps)
		}
		if deleters < 1 || total != int64(lapsed*len(housekeep.Tables)) {
			t.Fatalf("round %d: %d replicas deleted rows, %d rows in all; want all %d deleted once", round, deleters, total, lapsed*len(housekeep.Tables))
		}
		if left := keys(t, pools[0]); len(slices.Concat(slices.Collect(maps.Values(left))...)) != 0 {
			t.Fatalf("round %d: rows left: %v", round, left)
		}
	}
}

// logDeletes makes the test's database log every DELETE statement on a
// limit table, before and after it, with its transaction and the database
// clock, in public.delete_log: an observer of the sweeps that does not rely
// on what the housekeeper reports. (pglimit.slot holds every kind of slot;
// only housekeeping deletes from the limit tables.)
func logDeletes(t testing.TB, pool *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	stmts := []string{
		`CREATE TABLE public.delete_log (xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp())`,
		`CREATE FUNCTION public.log_delete() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN INSERT INTO public.delete_log DEFAULT VALUES; RETURN NULL; END $$`,
	}
	for _, table := range []string{"slot", "login_attempt", "replica", "api_request_window", "refusal_minute", "quota_usage", "quota_ledger", "ban", "access_rule"} {
		for _, when := range []string{"BEFORE", "AFTER"} {
			stmts = append(stmts, fmt.Sprintf(`CREATE TRIGGER log_delete_%s %s DELETE ON pglimit.%s FOR EACH STATEMENT EXECUTE FUNCTION public.log_delete()`,
				strings.ToLower(when), when, table))
		}
	}
	for _, s := range stmts {
		if _, err := pool.Exec(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
}

// deleteOverlaps returns the number of transactions public.delete_log saw
// delete, and describes the first two whose DELETEs overlapped ("" if
// none did).
func deleteOverlaps(t testing.TB, pool *pgxpool.Pool) (batches int, overlap string) {
	t.Helper()
	ctx := context.Background()
	if err := pool.QueryRow(ctx, `SELECT count(DISTINCT xid) FROM public.delete_log`).Scan(&batches); err != nil {
		t.Fatal(err)
	}
	err := pool.QueryRow(ctx, `
		WITH b AS (SELECT xid, min(at) AS lo, max(at) AS hi FROM public.delete_log GROUP BY xid)
		SELECT format('transaction %s deleted from %s to %s, transaction %s from %s to %s', x.xid, x.lo, x.hi, y.xid, y.lo, y.hi)
		FROM b x JOIN b y ON x.xid < y.xid AND x.lo < y.hi AND y.lo < x.hi
		LIMIT 1`).Scan(&overlap)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		t.Fatal(err)
	}
	return batches, overlap
}

// TestRunStopsWithContext: Run sweeps every interval (rows that lapse later
// are deleted by a later sweep) and returns promptly when its context
// ends, leaving the lock free.
func TestRunStopsWithContext(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 4)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	h := newHousekeeper(t, pool, housekeep.Options{Interval: 50 * time.Millisecond})
	go func() { done <- h.Run(ctx) }()
	for round := 0; round < 2; round++ {
		fill(t, pool, 4, 0)
		deadline := time.Now().Add(5 * time.Second)
		for {
			left := 0
			for _, ks := range keys(t, pool) {
				left += len(ks)
			}
			if left == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: %d lapsed rows still there", round, left)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	// A sweep canceled mid-batch ends its transaction on the server a
	// moment after the client gave up on it: the lock must go then.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		n := advisoryLocks(t, pool)
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d housekeeping locks held 5 s after Run returned", n)
		}
	}
	fill(t, pool, 1, 0)
	time.Sleep(150 * time.Millisecond)
	left := 0
	for _, ks := range keys(t, pool) {
		left += len(ks)
	}
	if left != len(housekeep.Tables) {
		t.Fatalf("%d rows left, want %d: something still sweeps after Run returned", left, len(housekeep.Tables))
	}
}

// TestOptions are checked once, at New.
func TestOptions(t *testing.T) {
	t.Parallel()
	pool, _ := pgtest.NewDB(t, 1)
	for name, o := range map[string]housekeep.Options{
		"negative interval": {Interval: -time.Second},
		"negative batch":    {Batch: -1},
		"huge batch":        {Batch: 1 << 30},
		"negative timeout":  {Timeout: -time.Second},
	} {
		if _, err := housekeep.New(pool, o); err == nil {
			t.Errorf("%s: New accepted it", name)
		}
	}
	if _, err := housekeep.New(nil, housekeep.Options{}); err == nil {
		t.Error("New accepted a nil pool")
	}
}
