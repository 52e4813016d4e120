package app

import (
	"context"
	"fmt"
	"math"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
)

// The SQL console's resources (issue 42, 5): what one console statement
// may take of the database server besides its time. Every console session
// runs with work_mem at -sql-console-work-mem and no parallel workers
// (each worker is a process of its own, with its own memory and temporary
// files), set in its transaction (ConsoleBound) and, for a role of the
// user's own, on the role; and with temp_file_limit at
// -sql-console-temp-file-limit, set on the user's role (console_login_role)
// where the service's role may set it: a superuser's parameter, so SUPERUSER
// or, on PostgreSQL 15, GRANT SET ON PARAMETER temp_file_limit. A console
// statement may change work_mem and the workers for what it runs itself
// (they are any session's settings), never temp_file_limit.
// checkConsoleResources reads what a console session actually gets, and
// says at start-up and in GET /api/limits (member console) what it lost.

// consoleResources is what console sessions run with, as PostgreSQL
// writes each setting, and what the console could not set, and why ("":
// nothing).
type consoleResources struct {
	TempFileLimit   string
	WorkMem         string
	ParallelWorkers int
	Lost            string
	// tempLocal is the temp_file_limit ConsoleBound sets in the
	// transaction: only on the service's own connection of a superuser
	// service (consoleOnPrimary); "" otherwise.
	tempLocal string
}

// consoleResourcesJSON is the member console of GET /api/limits.
type consoleResourcesJSON struct {
	// TempFileLimit is the temp_file_limit console sessions run with, as
	// PostgreSQL writes it ("-1": none).
	TempFileLimit string `json:"tempFileLimit"`
	// WorkMem is their work_mem.
	WorkMem string `json:"workMem"`
	// ParallelWorkers is their max_parallel_workers_per_gather.
	ParallelWorkers int `json:"parallelWorkers"`
	// Lost says what of -sql-console-temp-file-limit, -sql-console-work-mem
	// and parallel workers off the console runs without, and why; null
	// when it runs with all three.
	Lost *string `json:"lost"`
}

func (c *consoleResources) json() *consoleResourcesJSON {
	if c == nil {
		return nil
	}
	j := &consoleResourcesJSON{TempFileLimit: c.TempFileLimit, WorkMem: c.WorkMem, ParallelWorkers: c.ParallelWorkers}
	if c.Lost != "" {
		j.Lost = &c.Lost
	}
	return j
}

// maxKB is the largest temp_file_limit and work_mem PostgreSQL takes, in
// kB (INT_MAX).
const maxKB = math.MaxInt32

// memorySize is a size as PostgreSQL takes a memory setting: an integer,
// in kB without a unit, or with one of its units (which are case
// sensitive); space may stand between.
var memorySize = regexp.MustCompile(`^(-?[0-9]+)\s*(kB|MB|GB|TB)?$`)

// parseKB reads a memory setting as PostgreSQL writes it, in kB.
func parseKB(s string) (int64, error) {
	m := memorySize.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return 0, fmt.Errorf("%q is not a size (an integer with kB, MB, GB or TB, as PostgreSQL writes it: 256MB)", s)
	}
	n, err := strconv.ParseInt(m[1], 10, 64)
	if err != nil || n < -1 || n > maxKB || (n < 0 && m[2] != "") {
		return 0, fmt.Errorf("%q is out of range", s)
	}
	shift := map[string]uint{"": 0, "kB": 0, "MB": 10, "GB": 20, "TB": 30}[m[2]]
	if n > 0 && n > maxKB>>shift {
		return 0, fmt.Errorf("%q is more than %dkB, the most PostgreSQL takes", s, maxKB)
	}
	if n < 0 {
		return n, nil
	}
	return n << shift, nil
}

// consoleMemoryErrors checks -sql-console-temp-file-limit (-1: none, or
// 0 kB to maxKB) and -sql-console-work-mem (64 kB, PostgreSQL's least,
// to maxKB) before anything is set with them.
func (c *Config) consoleMemoryErrors() []error {
	var errs []error
	if _, err := parseKB(c.SQLConsoleTempFileLimit); err != nil {
		errs = append(errs, fmt.Errorf("-sql-console-temp-file-limit must be -1 (none) or a size: %w", err))
	}
	if kb, err := parseKB(c.SQLConsoleWorkMem); err != nil {
		errs = append(errs, fmt.Errorf("-sql-console-work-mem must be a size: %w", err))
	} else if kb < 64 {
		errs = append(errs, fmt.Errorf("-sql-console-work-mem must be at least 64kB, PostgreSQL's least: got %q", c.SQLConsoleWorkMem))
	}
	return errs
}

// consoleEnter begins a console transaction: SET LOCAL ROLE studio_console
// on the service's own connection (a fallback), and the console's
// resource settings (ConsoleBound).
func (a *App) consoleEnter(ctx context.Context, tx pgx.Tx) error {
	if a.consoleRole {
		if err := a.q.ConsoleEnterRole(ctx, tx); err != nil {
			return err
		}
	}
	var local string
	if a.consoleRes != nil {
		local = a.consoleRes.tempLocal
	}
	return a.q.ConsoleBound(ctx, tx, &studiodb.ConsoleBoundParams{WorkMem: a.cfg.SQLConsoleWorkMem, TempFileLimit: local})
}

// checkConsoleResources reads, through the console's own way in (as its
// probe user), the settings a console statement runs with, and says in the
// log what the console could not set; GET /api/limits says it too. A
// session that cannot be opened is logged and reported, not fatal: the
// console's own requests will fail as they would have.
func (a *App) checkConsoleResources(ctx context.Context) error {
	res := &consoleResources{}
	if a.consoleOnPrimary {
		who, err := a.q.ConsoleSession(ctx, a.primary)
		if err != nil {
			return err
		}
		if who.Superuser {
			res.tempLocal = a.cfg.SQLConsoleTempFileLimit
		}
	}
	a.consoleRes = res
	got, err := a.readConsoleSettings(ctx)
	if err != nil {
		a.log.Warn("the SQL console's settings could not be read at start-up", "err", err)
		res.Lost = "the console's settings could not be read at start-up (see the log)"
		return nil
	}
	res.TempFileLimit, res.WorkMem, res.ParallelWorkers = got.TempFileLimit, got.WorkMem, int(got.ParallelWorkers)
	var lost []string
	if !sameKB(got.TempFileLimit, a.cfg.SQLConsoleTempFileLimit) {
		lost = append(lost, fmt.Sprintf("console statements run with temp_file_limit %s, not %s (-sql-console-temp-file-limit): %s",
			got.TempFileLimit, a.cfg.SQLConsoleTempFileLimit, a.whyNoTempFileLimit()))
	}
	if !sameKB(got.WorkMem, a.cfg.SQLConsoleWorkMem) {
		lost = append(lost, fmt.Sprintf("console statements run with work_mem %s, not %s (-sql-console-work-mem)", got.WorkMem, a.cfg.SQLConsoleWorkMem))
	}
	if got.ParallelWorkers != 0 {
		lost = append(lost, fmt.Sprintf("console statements may start %d parallel workers each", got.ParallelWorkers))
	}
	res.Lost = strings.Join(lost, "; ")
	if res.Lost != "" {
		a.log.Warn("the SQL console runs without some of its resource settings: one console statement may write temporary files up to the server's own temp_file_limit (SECURITY.md)",
			"lost", res.Lost)
		return nil
	}
	a.log.Info("the SQL console's statements run with their resource settings", "temp_file_limit", got.TempFileLimit,
		"work_mem", got.WorkMem, "max_parallel_workers_per_gather", got.ParallelWorkers)
	return nil
}

// readConsoleSettings opens a console transaction as a console request
// does, for the probe user, and reads its settings.
func (a *App) readConsoleSettings(ctx context.Context) (*studiodb.ConsoleSettingsRow, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	conn := &throwawayConn{connect: func(ctx context.Context) (*pgx.Conn, func(), error) { return a.consoleConnect(ctx, consoleProbeUser) }}
	defer conn.close()
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{AccessMode: pgx.ReadOnly})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback(context.WithoutCancel(ctx)) }()
	if err := a.consoleEnter(ctx, tx); err != nil {
		return nil, err
	}
	return a.q.ConsoleSettings(ctx, tx)
}

// whyNoTempFileLimit says why the console's sessions lack its
// temp_file_limit, by the way they log in.
func (a *App) whyNoTempFileLimit() string {
	const grant = "SUPERUSER, or on PostgreSQL 15 and later GRANT SET ON PARAMETER temp_file_limit"
	switch {
	case a.consolePerUser:
		return "the service's role may not set it on the console users' roles: it needs " + grant + " TO " + a.consoleServiceRole()
	case a.consoleOnPrimary:
		return "the console runs as the service's own role, which may not set it (it needs " + grant + ")"
	case a.cfg.SQLConsoleURL != "":
		return fmt.Sprintf("the console logs in as -sql-console-url's role %q, whose settings the service does not change: a superuser can (ALTER ROLE %s SET temp_file_limit = '%s')",
			a.consoleBase.User, a.consoleBase.User, a.cfg.SQLConsoleTempFileLimit)
	default:
		return fmt.Sprintf("the console logs in as the shared role %s, whose settings the service may not change: a superuser can (ALTER ROLE %s SET temp_file_limit = '%s')",
			a.consoleBase.User, a.consoleBase.User, a.cfg.SQLConsoleTempFileLimit)
	}
}

// consoleServiceRole is the service's own role, as its connection names it.
func (a *App) consoleServiceRole() string {
	if u := a.primary.Config().ConnConfig.User; u != "" {
		return u
	}
	return "the service's role"
}

// sameKB reports whether two memory settings are the same size.
func sameKB(a, b string) bool {
	x, err1 := parseKB(a)
	y, err2 := parseKB(b)
	return err1 == nil && err2 == nil && x == y
}
