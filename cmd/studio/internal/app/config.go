// Package app is the reference service of pglimit: a small broker console
// whose routes ADR-0196 names, wrapped in every pglimit middleware. The
// command cmd/studio parses flags into a Config and runs an App; tests build
// an App directly or run the command as several replicas.
package app

import (
	"encoding/base64"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/quota"
)

// Config is everything the service is configured with. Flag names are the
// contract of REFERENCE-SERVICE.md.
type Config struct {
	Addr           string
	DatabaseURL    string // "" starts an embedded PostgreSQL
	ReadReplicaURL string
	ReplicaName    string
	Demo           bool
	demoSet        bool
	DemoUsers      int // with Demo, more users user00001… for load runs
	PoolMaxConns   int

	SQLConsoleURL  string
	SQLConsoleCap  int
	SQLConsoleTime time.Duration
	SQLConsoleRows int
	// SQLConsoleTempFileLimit and SQLConsoleWorkMem are set on every
	// console role (temp_file_limit, work_mem), with parallel workers off.
	SQLConsoleTempFileLimit string
	SQLConsoleWorkMem       string
	ExportCap               int
	ExportTime              time.Duration
	ExportRows              int
	HistoryCap              int
	HistoryTime             time.Duration
	HistoryRows             int
	FlowCap                 int
	FlowTime                time.Duration
	FlowRows                int

	SignInFailures int
	SignInWindow   time.Duration
	SignInStrict   bool
	// SignInAddressFailures are the failed sign-ins per client address per
	// SignInWindow, over every username; 0: off.
	SignInAddressFailures int
	// SignInUsernameFailures are the failed sign-ins per username per
	// SignInWindow over every client address, of clients without the
	// username's device cookie; 0: off.
	SignInUsernameFailures int
	UploadsPerHour         int
	UploadWindow           time.Duration
	MaxUploadBytes         int64
	TokenInFlight          int
	TokenInFlightKeep      time.Duration // how long a replica keeps a token's in-flight slot after its request; 0: off
	MaxRequestTime         time.Duration
	APIRate                Rate // requests per user (all its tokens) over /api/ but POST /api/session; Limit 0: off
	APIBurst               int
	APIBorrow              bool
	DryRun                 DryRun // limits that decide, count and log but refuse nobody

	APIQuota            Quota  // requests per user per day or month over /api/ but POST /api/session; Limit 0: off
	QuotaTimezone       string // the IANA zone of the quotas' days and months
	ExportRowsPerDay    int64  // audit rows a user may export per day; 0: off
	PluginBytesPerMonth int64  // plugin bytes a user may store per month; 0: off

	TrustedProxies Proxies // whose Forwarded / X-Forwarded-For is believed; none: the peer
	// ClientAddressHeader is the one header the trusted proxies write:
	// "X-Forwarded-For" or "Forwarded".
	ClientAddressHeader string
	// BodyTimeout bounds the time a request body takes to arrive.
	BodyTimeout time.Duration
	// MaxConnsPerPeer bounds the open connections of one peer address
	// (trusted proxies excepted).
	MaxConnsPerPeer int
	IPv6Prefix      int  // an IPv6 client is its prefix of this length
	AddressRate     Rate // requests without a token per client address; Limit 0: off
	AddressBurst    int

	BanAfter  int           // rate refusals of a key within BanWithin that ban it for BanFor; 0: no bans
	BanWithin time.Duration // the window BanAfter refusals are counted in
	BanFor    time.Duration // how long a ban lasts

	Nodes    Nodes
	NodeRate int

	CursorKey            string
	HeartbeatInterval    time.Duration
	HousekeepingInterval time.Duration
	ReplicaCheckInterval time.Duration
	LogFormat            string
	LogLevel             string
}

// Rate is -api-rate: Limit requests per Window, written N/s, N/m or N/h;
// "0" (Limit 0) turns the rate limit off.
type Rate struct {
	Limit  int
	Window time.Duration
}

func (r *Rate) String() string {
	if r.Limit == 0 {
		return "0"
	}
	unit := map[time.Duration]string{time.Second: "s", time.Minute: "m", time.Hour: "h"}[r.Window]
	return fmt.Sprintf("%d/%s", r.Limit, unit)
}

// Set parses N/s, N/m, N/h or 0.
func (r *Rate) Set(v string) error {
	limit, window, on, err := parseRate(v)
	if err != nil {
		return err
	}
	if !on {
		*r = Rate{}
		return nil
	}
	*r = Rate{Limit: limit, Window: window}
	return nil
}

// Quota is -api-quota: Limit requests per calendar Period, written N/day
// or N/month; "0" (Limit 0) turns the quota off.
type Quota struct {
	Limit  int64
	Period quota.Period
}

func (q *Quota) String() string {
	if q.Limit == 0 {
		return "0"
	}
	return fmt.Sprintf("%d/%s", q.Limit, q.Period)
}

// Set parses N/day, N/month or 0.
func (q *Quota) Set(v string) error {
	v = strings.TrimSpace(v)
	if v == "0" {
		*q = Quota{}
		return nil
	}
	n, unit, found := strings.Cut(v, "/")
	var p quota.Period
	switch {
	case !found:
		return fmt.Errorf("quota %q: want N/day, N/month or 0", v)
	case unit == "day":
		p = quota.Day
	case unit == "month":
		p = quota.Month
	default:
		return fmt.Errorf("quota %q: the period is day or month", v)
	}
	limit, err := strconv.ParseInt(n, 10, 64)
	if err != nil || limit < 1 || limit > quota.MaxLimit {
		return fmt.Errorf("quota %q: N is a whole number within 1..%d", v, int64(quota.MaxLimit))
	}
	*q = Quota{Limit: limit, Period: p}
	return nil
}

// LimitNames are the names of the service's limits, as -dry-run, the
// metric attribute limit and the operator page name them.
var LimitNames = []string{"sql-console", "audit-export", "audit-history", "event-history", "alert-history", "flow-graph",
	"sign-in", "sign-in-address", "sign-in-username", "uploads", "in-flight", "api", "address", "quota", "export-rows", "plugin-bytes"}

// DryRun is -dry-run: a comma-separated list of LimitNames, or "all"; the
// flag may be given more than once.
type DryRun map[string]bool

func (d DryRun) String() string {
	var names []string
	for _, n := range LimitNames {
		if d[n] {
			names = append(names, n)
		}
	}
	return strings.Join(names, ",")
}

// Set adds the limits of a comma-separated list; an unknown name is an
// error that lists the known ones.
func (d DryRun) Set(v string) error {
	for _, name := range strings.Split(v, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "all":
			for _, n := range LimitNames {
				d[n] = true
			}
		case slices.Contains(LimitNames, name):
			d[name] = true
		default:
			return fmt.Errorf("unknown limit %q: want a comma-separated list of %s, or all", name, strings.Join(LimitNames, ", "))
		}
	}
	return nil
}

// Nodes are the broker nodes, -node NAME=URL, repeatable.
type Nodes map[string]string

func (n Nodes) String() string {
	names := make([]string, 0, len(n))
	for k := range n {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = k + "=" + n[k]
	}
	return strings.Join(parts, ",")
}

// Set parses one NAME=URL.
func (n Nodes) Set(v string) error {
	name, raw, ok := strings.Cut(v, "=")
	if !ok || name == "" || raw == "" {
		return fmt.Errorf("want NAME=URL, got %q", v)
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("node %s: want an http(s) URL, got %q", name, raw)
	}
	if _, dup := n[name]; dup {
		return fmt.Errorf("node %s given twice", name)
	}
	n[name] = strings.TrimRight(raw, "/")
	return nil
}

// defaultReplicaName is host:pid, the name a replica gets in the registry
// (and on the rows it writes) when -replica-name is not given.
func defaultReplicaName() string {
	host, _ := os.Hostname()
	return fmt.Sprintf("%s:%d", host, os.Getpid())
}

// ParseFlags reads the command line (and DATABASE_URL, READ_REPLICA_URL,
// CURSOR_KEY from the environment) into a Config.
func ParseFlags(args []string) (*Config, error) {
	c := &Config{Nodes: Nodes{}, APIRate: Rate{Limit: 100, Window: time.Second}, DryRun: DryRun{},
		AddressRate: Rate{Limit: 20, Window: time.Second}}
	fs := flag.NewFlagSet("studio", flag.ContinueOnError)
	fs.StringVar(&c.Addr, "addr", "127.0.0.1:8080", "listen address")
	fs.StringVar(&c.DatabaseURL, "database-url", os.Getenv("DATABASE_URL"), "primary PostgreSQL URL (default $DATABASE_URL, else an embedded throwaway PostgreSQL)")
	fs.StringVar(&c.ReadReplicaURL, "read-replica-url", os.Getenv("READ_REPLICA_URL"), "read replica for history reads (default $READ_REPLICA_URL, else none)")
	fs.StringVar(&c.ReplicaName, "replica-name", defaultReplicaName(), "name in the replica registry")
	fs.BoolVar(&c.Demo, "demo", false, "seed demo users, tokens and history (default on when embedded)")
	fs.IntVar(&c.DemoUsers, "demo-users", 0, "with -demo, also seed N users user00001… (password studio, token user00001-token …) for load runs")
	fs.IntVar(&c.PoolMaxConns, "pool-max-conns", 16, "pgxpool size; installation-wide heavy cap = max(1, this / 4)")

	fs.StringVar(&c.SQLConsoleURL, "sql-console-url", os.Getenv("SQL_CONSOLE_URL"), "connection the SQL console runs on, as a role that may only read the history tables (default $SQL_CONSOLE_URL, else the primary as user studio_console, else SET ROLE on the primary)")
	fs.IntVar(&c.SQLConsoleCap, "sql-console-cap", 2, "SQL console queries per user at once, across replicas")
	fs.DurationVar(&c.SQLConsoleTime, "sql-console-time", 30*time.Second, "SQL console time bound")
	fs.IntVar(&c.SQLConsoleRows, "sql-console-rows", 1000, "SQL console row cap")
	fs.StringVar(&c.SQLConsoleTempFileLimit, "sql-console-temp-file-limit", "256MB", "temp_file_limit set on every console role: the temporary files one console statement may write (PostgreSQL units: kB, MB, GB; -1 for none)")
	fs.StringVar(&c.SQLConsoleWorkMem, "sql-console-work-mem", "16MB", "work_mem set on every console role: the memory one sort or hash of a console statement may use before it spills to temporary files")
	fs.IntVar(&c.ExportCap, "export-cap", 1, "audit exports per user at once")
	fs.DurationVar(&c.ExportTime, "export-time", 60*time.Second, "audit export time bound")
	fs.IntVar(&c.ExportRows, "export-rows", 100000, "audit export row cap")
	fs.IntVar(&c.HistoryCap, "history-cap", 4, "history reads per user at once, per history endpoint")
	fs.DurationVar(&c.HistoryTime, "history-time", 10*time.Second, "time bound of history reads")
	fs.IntVar(&c.HistoryRows, "history-rows", 10000, "row cap of history reads: page numbers reach this many rows and the total counts at most this many (at least the largest page, 200)")
	fs.IntVar(&c.FlowCap, "flow-cap", 2, "flow graph reads per user at once")
	fs.DurationVar(&c.FlowTime, "flow-time", 10*time.Second, "flow graph time bound")
	fs.IntVar(&c.FlowRows, "flow-rows", 1000, "flow graph row cap: the busiest this many address pairs (edges) are answered")

	fs.IntVar(&c.SignInFailures, "sign-in-failures", 5, "failed sign-ins allowed per username and client address (or device cookie) per -sign-in-window")
	fs.DurationVar(&c.SignInWindow, "sign-in-window", 15*time.Minute, "sign-in throttle window")
	fs.IntVar(&c.SignInUsernameFailures, "sign-in-username-failures", 50, "failed sign-ins allowed per username per -sign-in-window over every client address; not applied to a client presenting a device cookie set by an earlier successful sign-in of that username; 0 turns it off")
	fs.IntVar(&c.SignInAddressFailures, "sign-in-address-failures", 20, "failed sign-ins allowed per client address per -sign-in-window, over every username (password spraying), strict like the username's; 0 turns it off")
	fs.BoolVar(&c.SignInStrict, "sign-in-strict", true, "reserve each attempt before the password is checked, so no more than -sign-in-failures are evaluated even under a parallel burst; -sign-in-strict=false checks a burst in full")
	fs.IntVar(&c.UploadsPerHour, "uploads-per-hour", 5, "plugin uploads per user per rolling window")
	fs.DurationVar(&c.UploadWindow, "upload-window", time.Hour, "the rolling window of -uploads-per-hour")
	fs.Int64Var(&c.MaxUploadBytes, "max-upload-bytes", 8<<20, "largest plugin accepted")
	fs.IntVar(&c.TokenInFlight, "token-in-flight", 8, "concurrent requests per API token, across replicas")
	fs.DurationVar(&c.TokenInFlightKeep, "token-in-flight-keep", 0, "keep a token's in-flight slot with this replica for this long after its request, so that its next request here claims nothing (inflight.Options.Keep; the cap stays exact, idle slots are given back when another replica needs them); 0 turns it off")
	fs.DurationVar(&c.MaxRequestTime, "max-request-time", 2*time.Minute, "longest request; in-flight rows lapse this + 30s after they start")
	fs.Var(&c.APIRate, "api-rate", "request rate per user, every API token of the user together, over every /api/ route but POST /api/session, across replicas: N/s, N/m or N/h; 0 turns it off")
	fs.BoolVar(&c.APIBorrow, "api-borrow", false, "the rate limit borrows units for hot tokens in batches and spends them in memory (never admits past the GCRA bound; units a replica holds may refuse another replica's request)")
	fs.IntVar(&c.APIBurst, "api-burst", 200, "requests a user may make at once above -api-rate (GCRA: in any interval of length L at most burst + rate × L are admitted)")
	fs.Var(&c.TrustedProxies, "trusted-proxies", "comma-separated CIDRs whose Forwarded / X-Forwarded-For is believed: the client address is the rightmost address not in this set (default none: the peer address)")
	fs.StringVar(&c.ClientAddressHeader, "client-address-header", "X-Forwarded-For", "the one header the trusted proxies write, X-Forwarded-For or Forwarded; the other never changes the client address")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", 30*time.Second, "a request body not received within this time is dropped")
	fs.IntVar(&c.MaxConnsPerPeer, "max-conns-per-peer", 64, "open connections per peer address (trusted proxies excepted); more are closed at once")
	fs.IntVar(&c.IPv6Prefix, "ipv6-prefix", 64, "IPv6 client addresses are one client per prefix of this length (1 to 128)")
	fs.Var(&c.AddressRate, "address-rate", "request rate per client address of every request without a token (every /api/ route, POST /api/session included), across replicas: N/s, N/m or N/h; 0 turns it off")
	fs.IntVar(&c.AddressBurst, "address-burst", 40, "requests a client address may make at once above -address-rate")
	fs.IntVar(&c.BanAfter, "ban-after", 0, "a user, token or client address refused by a rate limit this many times within -ban-within is refused on every replica for -ban-for (429 banned); 0 turns bans off")
	fs.DurationVar(&c.BanWithin, "ban-within", time.Minute, "the window -ban-after refusals are counted in")
	fs.DurationVar(&c.BanFor, "ban-for", 15*time.Minute, "how long a ban lasts (an operator lifts one with DELETE /api/limits/bans/{key})")

	fs.Var(&c.APIQuota, "api-quota", "calendar quota of requests per user over every /api/ route but POST /api/session, across replicas: N/day or N/month; 0 turns it off")
	fs.StringVar(&c.QuotaTimezone, "quota-timezone", "UTC", "the IANA time zone whose midnight starts a quota's day and whose 1st starts its month")
	fs.Int64Var(&c.ExportRowsPerDay, "export-rows-per-day", 0, "audit rows a user may export per day, charged after each export by the rows it sent; 0 turns it off")
	fs.Int64Var(&c.PluginBytesPerMonth, "plugin-bytes-per-month", 0, "plugin bytes a user may store per month, debited in the transaction that stores the plugin; 0 turns it off")

	fs.Var(c.DryRun, "dry-run", "limits that decide, count and log what they would refuse, and refuse nobody: a comma-separated list of "+strings.Join(LimitNames, ", ")+", or all")

	fs.Var(c.Nodes, "node", "broker node NAME=URL (Jolokia base URL), repeatable")
	fs.IntVar(&c.NodeRate, "node-rate", 20, "calls per second per node for the whole installation")

	fs.StringVar(&c.CursorKey, "cursor-key", os.Getenv("CURSOR_KEY"), "key that signs paging cursors; replicas must share it (default $CURSOR_KEY, else random per process)")
	fs.DurationVar(&c.HeartbeatInterval, "heartbeat", 5*time.Second, "replica registry heartbeat interval")
	fs.DurationVar(&c.HousekeepingInterval, "housekeeping", time.Minute, "interval of the removal of lapsed limit rows")
	fs.DurationVar(&c.ReplicaCheckInterval, "read-replica-check", time.Second, "health check interval of the read replica")
	fs.StringVar(&c.LogFormat, "log-format", "text", "log format: text or json")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "demo" {
			c.demoSet = true
		}
	})
	if key := os.Getenv("CURSOR_KEY"); c.CursorKey == "" && key != "" {
		c.CursorKey = key
	}
	return c, c.Validate()
}

// DemoFor reports whether demo data is seeded: as asked with -demo, or on
// by default for an embedded database.
func (c *Config) DemoFor(embedded bool) bool {
	if c.demoSet {
		return c.Demo
	}
	return embedded
}

// Validate checks the bounds once, at start-up.
func (c *Config) Validate() error {
	var errs []error
	positive := func(name string, v int) {
		if v < 1 {
			errs = append(errs, fmt.Errorf("-%s must be at least 1", name))
		}
	}
	positiveDur := func(name string, v time.Duration) {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("-%s must be positive", name))
		}
	}
	positive("pool-max-conns", c.PoolMaxConns)
	if c.DemoUsers < 0 || c.DemoUsers > 1_000_000 {
		errs = append(errs, errors.New("-demo-users must be from 0 to 1000000"))
	}
	positive("sql-console-cap", c.SQLConsoleCap)
	positive("sql-console-rows", c.SQLConsoleRows)
	positive("export-cap", c.ExportCap)
	positive("export-rows", c.ExportRows)
	positive("history-cap", c.HistoryCap)
	positive("flow-cap", c.FlowCap)
	positive("flow-rows", c.FlowRows)
	if c.HistoryRows < maxPageSize {
		errs = append(errs, fmt.Errorf("-history-rows must be at least %d, the largest page", maxPageSize))
	}
	positive("sign-in-failures", c.SignInFailures)
	if c.SignInAddressFailures < 0 || c.SignInAddressFailures > pglimit.MaxLimit {
		errs = append(errs, fmt.Errorf("-sign-in-address-failures must be from 0 (off) to %d", pglimit.MaxLimit))
	}
	if c.SignInUsernameFailures < 0 || c.SignInUsernameFailures > pglimit.MaxLimit {
		errs = append(errs, fmt.Errorf("-sign-in-username-failures must be from 0 (off) to %d", pglimit.MaxLimit))
	}
	switch strings.ToLower(c.ClientAddressHeader) {
	case "x-forwarded-for", "forwarded":
	default:
		errs = append(errs, errors.New("-client-address-header must be X-Forwarded-For or Forwarded"))
	}
	positive("max-conns-per-peer", c.MaxConnsPerPeer)
	positiveDur("body-timeout", c.BodyTimeout)
	positive("uploads-per-hour", c.UploadsPerHour)
	positive("token-in-flight", c.TokenInFlight)
	if c.TokenInFlightKeep < 0 {
		errs = append(errs, errors.New("-token-in-flight-keep must not be negative"))
	}
	positive("node-rate", c.NodeRate)
	if c.APIRate.Limit > 0 && (c.APIBurst < 1 || c.APIBurst > pglimit.MaxLimit) {
		errs = append(errs, fmt.Errorf("-api-burst must be from 1 to %d", pglimit.MaxLimit))
	}
	if c.AddressRate.Limit > 0 && (c.AddressBurst < 1 || c.AddressBurst > pglimit.MaxLimit) {
		errs = append(errs, fmt.Errorf("-address-burst must be from 1 to %d", pglimit.MaxLimit))
	}
	if c.BanAfter < 0 || c.BanAfter > banMaxAfter {
		errs = append(errs, fmt.Errorf("-ban-after must be from 0 (off) to %d", banMaxAfter))
	}
	if c.BanAfter > 0 {
		for _, d := range []struct {
			name string
			v    time.Duration
		}{{"ban-within", c.BanWithin}, {"ban-for", c.BanFor}} {
			if d.v < time.Millisecond || d.v > banMaxDuration {
				errs = append(errs, fmt.Errorf("-%s must be from 1ms to %v", d.name, banMaxDuration))
			}
		}
	}
	if c.IPv6Prefix < 1 || c.IPv6Prefix > 128 {
		errs = append(errs, errors.New("-ipv6-prefix must be from 1 to 128"))
	}
	positiveDur("sql-console-time", c.SQLConsoleTime)
	errs = append(errs, c.consoleMemoryErrors()...)
	positiveDur("export-time", c.ExportTime)
	positiveDur("history-time", c.HistoryTime)
	positiveDur("flow-time", c.FlowTime)
	positiveDur("sign-in-window", c.SignInWindow)
	positiveDur("upload-window", c.UploadWindow)
	positiveDur("max-request-time", c.MaxRequestTime)
	positiveDur("heartbeat", c.HeartbeatInterval)
	positiveDur("housekeeping", c.HousekeepingInterval)
	positiveDur("read-replica-check", c.ReplicaCheckInterval)
	if _, err := c.quotaLocation(); err != nil {
		errs = append(errs, err)
	}
	for _, q := range []struct {
		name string
		v    int64
	}{{"export-rows-per-day", c.ExportRowsPerDay}, {"plugin-bytes-per-month", c.PluginBytesPerMonth}} {
		if q.v < 0 || q.v > quota.MaxLimit {
			errs = append(errs, fmt.Errorf("-%s must be from 0 (off) to %d", q.name, int64(quota.MaxLimit)))
		}
	}
	if c.MaxUploadBytes < 1 {
		errs = append(errs, errors.New("-max-upload-bytes must be at least 1"))
	}
	if c.ReplicaName == "" {
		errs = append(errs, errors.New("-replica-name must not be empty"))
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		errs = append(errs, errors.New("-log-format must be text or json"))
	}
	return errors.Join(errs...)
}

// quotaLocation is -quota-timezone as a location: an IANA name ("UTC" when
// empty); "Local" and a zone Go does not know are errors naming the flag.
func (c *Config) quotaLocation() (*time.Location, error) {
	name := c.QuotaTimezone
	if name == "" {
		name = "UTC"
	}
	if name == "Local" {
		return nil, errors.New("-quota-timezone must be an IANA time zone such as Europe/Paris, not Local")
	}
	loc, err := time.LoadLocation(name)
	if err != nil {
		return nil, fmt.Errorf("-quota-timezone: unknown time zone %q: want an IANA name such as Europe/Paris", name)
	}
	return loc, nil
}

// parseCursorKey decodes -cursor-key, given as base64 (standard or URL
// alphabet, padding optional), e.g. the output of `openssl rand -base64
// 32`. It refuses a key shorter than 16 bytes, the least cursor.NewCodec
// takes.
func parseCursorKey(s string) ([]byte, error) {
	s = strings.TrimRight(strings.TrimSpace(s), "=")
	enc := base64.RawStdEncoding
	if strings.ContainsAny(s, "-_") {
		enc = base64.RawURLEncoding
	}
	key, err := enc.DecodeString(s)
	if err != nil {
		return nil, errors.New("key is not base64")
	}
	if len(key) < 16 {
		return nil, errors.New("key shorter than 16 bytes")
	}
	return key, nil
}

// parseRate reads a rate written "N/s", "N/m" or "N/h" (N requests per
// second, minute or hour; N up to 1,000,000, the most a rate policy
// takes) into a Limit and a Window. "0" is no rate at all: ok is false
// and err nil.
func parseRate(s string) (limit int, window time.Duration, ok bool, err error) {
	s = strings.TrimSpace(s)
	if s == "0" {
		return 0, 0, false, nil
	}
	n, unit, found := strings.Cut(s, "/")
	if !found {
		return 0, 0, false, fmt.Errorf("rate %q: want N/s, N/m, N/h or 0", s)
	}
	switch unit {
	case "s":
		window = time.Second
	case "m":
		window = time.Minute
	case "h":
		window = time.Hour
	default:
		return 0, 0, false, fmt.Errorf("rate %q: the unit is s, m or h", s)
	}
	limit, err = strconv.Atoi(n)
	if err != nil || limit < 1 || limit > 1_000_000 {
		return 0, 0, false, fmt.Errorf("rate %q: N is a whole number within 1..1000000", s)
	}
	return limit, window, true, nil
}
