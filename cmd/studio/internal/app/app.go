package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/ban"
	"github.com/pglimit/pglimit/clientaddr"
	"github.com/pglimit/pglimit/cmd/internal/jolokia"
	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/middleware/readroute"
	"github.com/pglimit/pglimit/middleware/rules"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
	"github.com/pglimit/pglimit/nodelimit"
	"github.com/pglimit/pglimit/override"
	"github.com/pglimit/pglimit/problem"
	"github.com/pglimit/pglimit/ratelimit"
	"github.com/pglimit/pglimit/replica"
)

// App is one replica of the reference service.
type App struct {
	cfg     *Config
	log     *slog.Logger
	primary *pgxpool.Pool
	replica *pgxpool.Pool // nil without a read replica

	q *studiodb.Queries

	// signin counts failed sign-ins per username and client (its address,
	// or its device cookie): -sign-in-failures.
	signin *signin.Limiter
	// signinAddr counts failed sign-ins per client address, around signin
	// (nil: -sign-in-address-failures 0).
	signinAddr *signin.Limiter
	// signinUser counts failed sign-ins per username over every client
	// without its device cookie, inside signin, and sets the cookie (nil:
	// -sign-in-username-failures 0).
	signinUser *signin.Limiter
	// devices are the device cookies of the sign-in throttles, signed with
	// the keys in device_cookie_key.
	devices      *signin.Devices
	uploads      *upload.Limiter
	inflight     *inflight.Limiter
	rate         *ratelimit.Limiter // nil with -api-rate 0
	rateHTTP     *mratelimit.Middleware
	addrs        *clientaddr.Resolver
	addrRate     *ratelimit.Limiter // nil with -address-rate 0
	addrRateHTTP *mratelimit.Middleware
	// rules are the allow and deny lists; denyByAddress guards every
	// route but the health checks by the client address, outermost;
	// denyByKey guards the routes with a token after the authentication.
	rules         *access.Rules
	denyByAddress *rules.Guard
	denyByKey     *rules.Guard
	bans          *ban.Bans // nil with -ban-after 0
	// overrides are the keys' own limits (PUT /api/limits/overrides),
	// read by the rates and the quotas.
	overrides *override.Store
	endpoints endpoints
	quotas    quotas
	pager     *cursor.Pager

	meters   metric.MeterProvider
	promReg  *prometheus.Registry
	registry *replica.Registry

	router    *readroute.Router
	nodeLimit *nodelimit.Limiter
	// readyReplicas is the ready count the node limiter last read.
	readyReplicas atomic.Int64
	nodes         map[string]*jolokia.Client

	consoleRole      bool              // the console runs as the service with SET ROLE studio_console (a fallback)
	consolePerUser   bool              // each console user logs in as a role of their own
	consoleOnPrimary bool              // the console runs on the primary's pool, as the service's role (a fallback)
	consoleBase      *pgx.ConnConfig   // the console's connection (per user: its user and password are replaced)
	consoleLogins    sync.Map          // username → *pgx.ConnConfig of the user's role, made on first use
	consoleRes       *consoleResources // what console statements run with (checkConsoleResources)
	// tokens are the tokens this replica verified lately, and lookups the
	// banned addresses' budgets of token lookups (banGuard).
	tokens  tokenMemory
	lookups lookupBudgets
	closers []func()
	handler http.Handler
	started time.Time
}

// endpoints are the heavy endpoints, one heavy.Limiter each.
type endpoints struct {
	sqlConsole, export, audit, events, alerts, flow *heavy.Limiter
}

// New connects to the databases, migrates them (pglimit's schema, then the
// service's), seeds the demo data when asked, and builds the handler. The
// caller runs Run for the background work and Close at the end.
func New(ctx context.Context, cfg *Config, embedded bool, log *slog.Logger) (*App, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	a := &App{cfg: cfg, log: log, q: studiodb.New(), started: time.Now()}
	ok := false
	defer func() {
		if !ok {
			a.Close()
		}
	}()

	var err error
	a.primary, err = openPool(ctx, cfg.DatabaseURL, cfg.PoolMaxConns, cfg.ReplicaName)
	if err != nil {
		return nil, fmt.Errorf("primary: %w", err)
	}
	a.closers = append(a.closers, a.primary.Close)
	if cfg.ReadReplicaURL != "" {
		// A replica that is down at start-up is not fatal: reads go to the
		// primary until it answers.
		a.replica, err = openPool(ctx, cfg.ReadReplicaURL, cfg.PoolMaxConns, cfg.ReplicaName)
		if err != nil {
			return nil, fmt.Errorf("read replica: %w", err)
		}
		a.closers = append(a.closers, a.replica.Close)
	}

	if err := pglimit.Migrate(ctx, a.primary); err != nil {
		return nil, err
	}
	if err := studioschema.Apply(ctx, a.primary); err != nil {
		return nil, err
	}
	if cfg.DemoFor(embedded) {
		demo := DemoData()
		demo.NumberedUsers = cfg.DemoUsers
		if err := Seed(ctx, a.primary, demo); err != nil {
			return nil, fmt.Errorf("demo seed: %w", err)
		}
	}
	if err := a.setupConsole(ctx); err != nil {
		return nil, err
	}

	if err := a.setupMetrics(); err != nil {
		return nil, err
	}
	if err := a.setupBans(); err != nil {
		return nil, err
	}
	if err := a.setupOverrides(ctx); err != nil {
		return nil, err
	}
	if err := a.setupAddress(); err != nil {
		return nil, err
	}
	if err := a.setupDevices(ctx); err != nil {
		return nil, err
	}
	if err := a.setupLimits(); err != nil {
		return nil, err
	}
	if err := a.setupQuotas(ctx); err != nil {
		return nil, err
	}
	if err := a.setupAccess(ctx); err != nil {
		return nil, err
	}
	// The registry, the node limiter and the read router start nothing
	// here: Run runs them. The first share of each node's rate is read
	// now (the registry counts this replica before its first heartbeat),
	// so that this replica keeps to its share from its first call.
	a.registry, err = replica.New(a.primary, replica.Options{Name: cfg.ReplicaName, Interval: cfg.HeartbeatInterval, Logger: log})
	if err != nil {
		return nil, err
	}
	if err := a.setupNodes(); err != nil {
		return nil, err
	}
	if err := a.nodeLimit.Refresh(ctx); err != nil {
		log.Warn("ready replicas not read yet", "err", err)
	}
	a.router, err = readroute.New(a.primary, a.replica, readroute.Options{Interval: cfg.ReplicaCheckInterval, Logger: log,
		MeterProvider: a.meters})
	if err != nil {
		return nil, err
	}
	a.handler = withWriteDeadline(a.routes())
	ok = true
	return a, nil
}

func openPool(ctx context.Context, url string, maxConns int, appName string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = int32(maxConns)
	cfg.ConnConfig.RuntimeParams["application_name"] = "studio " + appName
	// A connection broken by a database restart is found before use, so a
	// replica recovers on its own once the database is back.
	cfg.HealthCheckPeriod = 5 * time.Second
	if cfg.ConnConfig.ConnectTimeout == 0 {
		cfg.ConnConfig.ConnectTimeout = 5 * time.Second
	}
	return pgxpool.NewWithConfig(ctx, cfg)
}

func (a *App) setupMetrics() error {
	a.promReg = prometheus.NewRegistry()
	// The process's own Go runtime (go_memstats_*, go_goroutines): what
	// an operator (and TestAddressKeysMemory) reads the heap by.
	if err := a.promReg.Register(collectors.NewGoCollector()); err != nil {
		return err
	}
	exporter, err := otelprom.New(otelprom.WithRegisterer(a.promReg))
	if err != nil {
		return err
	}
	provider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	a.meters = provider
	a.closers = append(a.closers, func() { _ = provider.Shutdown(context.Background()) })
	return nil
}

func (a *App) setupLimits() error {
	cfg := a.cfg
	heavyEndpoint := func(name string, limit int, bound time.Duration, rows int) (*heavy.Limiter, error) {
		return heavy.New(a.primary, heavy.Options{
			Name: name, Key: userOf, Limit: limit, Time: bound, Rows: rows,
			InstallationLimit: a.installationCap(),
			Replica:           cfg.ReplicaName,
			Logger:            a.log,
			MeterProvider:     a.meters,
			DryRun:            cfg.DryRun[name],
		})
	}
	for _, ep := range []struct {
		into  **heavy.Limiter
		name  string
		limit int
		bound time.Duration
		rows  int
	}{
		{&a.endpoints.sqlConsole, "sql-console", cfg.SQLConsoleCap, cfg.SQLConsoleTime, cfg.SQLConsoleRows},
		{&a.endpoints.export, "audit-export", cfg.ExportCap, cfg.ExportTime, cfg.ExportRows},
		{&a.endpoints.audit, "audit-history", cfg.HistoryCap, cfg.HistoryTime, cfg.HistoryRows},
		{&a.endpoints.events, "event-history", cfg.HistoryCap, cfg.HistoryTime, cfg.HistoryRows},
		{&a.endpoints.alerts, "alert-history", cfg.HistoryCap, cfg.HistoryTime, cfg.HistoryRows},
		{&a.endpoints.flow, "flow-graph", cfg.FlowCap, cfg.FlowTime, cfg.FlowRows},
	} {
		l, err := heavyEndpoint(ep.name, ep.limit, ep.bound, ep.rows)
		if err != nil {
			return fmt.Errorf("heavy endpoint %s: %w", ep.name, err)
		}
		*ep.into = l
	}
	var codec *cursor.Codec
	if cfg.CursorKey != "" {
		key, err := parseCursorKey(cfg.CursorKey)
		if err != nil {
			return fmt.Errorf("-cursor-key: %w", err)
		}
		if codec, err = cursor.NewCodec(key); err != nil {
			return err
		}
	} else {
		a.log.Warn("no -cursor-key: paging cursors are signed with a random key of this process; replicas must share one -cursor-key (or CURSOR_KEY), or a cursor from one is refused by another")
	}
	var err error
	// The history row cap is how far page numbers reach and how far the
	// total counts: a history read reads at most that many rows for its
	// page and as many for its total.
	if a.pager, err = cursor.NewPager(codec, cursor.Rules{MaxSize: maxPageSize, Limit: cfg.HistoryRows}); err != nil {
		return err
	}
	// The sign-in throttles: per client address over every username
	// (spraying), around per username and client (its address, or its
	// device), around per username over every client without its device
	// cookie (which sets the cookie). Each reads the username as the
	// handler does (signInUsername) and the client address as every
	// address limit does (a.addrs).
	throttle := func(name, scope string, limit int) (*signin.Limiter, error) {
		o := signin.Options{
			Name:          name,
			Scope:         scope,
			Username:      signInUsername,
			Addresses:     a.addrs,
			Devices:       a.devices,
			MaxBodyBytes:  maxSessionBody,
			Limit:         limit,
			Window:        cfg.SignInWindow,
			Lenient:       !cfg.SignInStrict,
			Logger:        a.log,
			MeterProvider: a.meters,
			DryRun:        cfg.DryRun[name],
		}
		if scope == "address" {
			// An address on the allow list is exempt from its throttle
			// (the guard by address in front of every route marked it; a
			// sign-in has no user yet), not from the username's.
			o.Exempt = rules.Allowed
		}
		return signin.New(a.primary, o)
	}
	if a.signin, err = throttle("sign-in", "pair", cfg.SignInFailures); err != nil {
		return err
	}
	if cfg.SignInAddressFailures > 0 {
		if a.signinAddr, err = throttle("sign-in-address", "address", cfg.SignInAddressFailures); err != nil {
			return err
		}
	}
	if cfg.SignInUsernameFailures > 0 {
		if a.signinUser, err = throttle("sign-in-username", "username", cfg.SignInUsernameFailures); err != nil {
			return err
		}
	}
	a.uploads, err = upload.New(a.primary, upload.Options{
		Key:           userOf,
		Limit:         cfg.UploadsPerHour,
		Window:        cfg.UploadWindow,
		Replica:       cfg.ReplicaName,
		Logger:        a.log,
		MeterProvider: a.meters,
		DryRun:        cfg.DryRun["uploads"],
	})
	if err != nil {
		return err
	}
	a.inflight, err = inflight.New(a.primary, inflight.Options{
		Key:           tokenOf,
		Limit:         cfg.TokenInFlight,
		Keep:          cfg.TokenInFlightKeep,
		MaxDuration:   cfg.MaxRequestTime,
		Replica:       cfg.ReplicaName,
		Logger:        a.log,
		MeterProvider: a.meters,
		DryRun:        cfg.DryRun["in-flight"],
	})
	if err != nil || cfg.APIRate.Limit == 0 {
		return err
	}
	a.rate, err = ratelimit.New(a.primary, ratelimit.Options{
		Name: "api",
		Policies: []ratelimit.Policy{{Name: "api", Limit: cfg.APIRate.Limit, Window: cfg.APIRate.Window,
			Burst: cfg.APIBurst}},
		Borrow:        cfg.APIBorrow,
		Ban:           a.bans,
		Overrides:     a.overrides,
		Logger:        a.log,
		MeterProvider: a.meters,
		DryRun:        cfg.DryRun["api"],
	})
	if err != nil {
		return err
	}
	a.rateHTTP, err = mratelimit.New(mratelimit.Options{Limiter: a.rate, Key: rateKeyOf,
		Exempt: rules.Allowed, OnError: rateError("user"), Logger: a.log})
	return err
}

// rateLimited counts a request of an API token in its user's rate
// (-api-rate, -api-burst: every token of the user together), when there is
// one.
func (a *App) rateLimited(next http.Handler) http.Handler {
	if a.rate == nil {
		return next
	}
	return a.rateHTTP.Handler(next)
}

// installationCap is the cap over all heavy requests of all replicas:
// max(1, -pool-max-conns / 4).
func (a *App) installationCap() int { return max(1, a.cfg.PoolMaxConns/4) }

// Handler is the service's HTTP handler.
func (a *App) Handler() http.Handler { return a.handler }

// Run does the background work until ctx ends: the registry heartbeat and
// housekeeping (pglimit.Run), the read replica's health checks, the node
// rate's refresh, and keeping the access lists and the overrides current. It returns nil then, after every part has ended
// (the registry removes this replica's row last); a part that fails early
// ends the others and its error is returned.
func (a *App) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	parts := []func(context.Context) error{
		func(ctx context.Context) error {
			return pglimit.Run(ctx, a.primary, pglimit.RunOptions{Registry: a.registry,
				Housekeeping: a.cfg.HousekeepingInterval, Logger: a.log, MeterProvider: a.meters})
		},
		a.router.Run,
		a.nodeLimit.Run,
		a.rules.Run,
		a.overrides.Run,
	}
	errc := make(chan error, len(parts))
	for _, part := range parts {
		go func() {
			err := part(ctx)
			if err != nil {
				cancel()
			}
			errc <- err
		}()
	}
	var errs []error
	for range parts {
		if err := <-errc; err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Drain marks this replica not ready in the registry while it finishes the
// requests it has: the other replicas stop counting it at once.
func (a *App) Drain(ctx context.Context) {
	if err := a.registry.Drain(ctx); err != nil {
		a.log.Warn("drain", "err", err)
	}
}

// Flush waits until every permit, slot and upload given back so far has
// reached the database, and gives back the rate units this replica
// borrowed and did not spend (-api-borrow): at shutdown, after the server
// stopped serving, Flush sees them there before the pools close (a killed
// process leaves them to lapse on their own).
func (a *App) Flush(ctx context.Context) error {
	var errs []error
	if a.inflight != nil {
		errs = append(errs, a.inflight.Flush(ctx))
	}
	if a.uploads != nil {
		errs = append(errs, a.uploads.Flush(ctx))
	}
	if a.rate != nil {
		errs = append(errs, a.rate.Flush(ctx))
	}
	e := a.endpoints
	for _, l := range []*heavy.Limiter{e.sqlConsole, e.export, e.audit, e.events, e.alerts, e.flow} {
		if l != nil {
			errs = append(errs, l.Flush(ctx))
		}
	}
	return errors.Join(errs...)
}

// Close releases the pools and the metric provider.
func (a *App) Close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
	a.closers = nil
}

// metricsHandler serves the OpenTelemetry metrics in Prometheus text.
func (a *App) metricsHandler() http.Handler {
	return promhttp.HandlerFor(a.promReg, promhttp.HandlerOpts{})
}

// ServeHTTP answers requests no route takes (404, 405) with problem
// details, like every other refusal.
type problemMux struct{ mux *http.ServeMux }

func (p problemMux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h, pattern := p.mux.Handler(r)
	if pattern != "" {
		p.mux.ServeHTTP(w, r)
		return
	}
	// The mux's own 404 or 405: learn which, keep its Allow header, and
	// answer with a problem instead of plain text.
	c := &captureHeader{header: http.Header{}}
	h.ServeHTTP(c, r)
	status := c.status
	if status == 0 {
		status = http.StatusNotFound
	}
	if allow := c.header.Get("Allow"); allow != "" {
		w.Header().Set("Allow", allow)
	}
	switch status {
	case http.StatusMethodNotAllowed:
		problem.Write(w, &problem.Details{Slug: "method-not-allowed", Title: "Method not allowed", Status: status,
			Detail: fmt.Sprintf("%s is not allowed on %s.", r.Method, r.URL.Path)})
	default:
		problem.Write(w, &problem.Details{Slug: "not-found", Title: "Not found", Status: http.StatusNotFound,
			Detail: "No route serves this path."})
	}
}

type captureHeader struct {
	header http.Header
	status int
}

func (c *captureHeader) Header() http.Header         { return c.header }
func (c *captureHeader) Write(b []byte) (int, error) { return len(b), nil }
func (c *captureHeader) WriteHeader(s int)           { c.status = s }
