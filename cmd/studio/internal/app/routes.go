package app

import (
	"context"
	"net/http"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/readroute"
)

// routes is the contract of REFERENCE-SERVICE.md.
func (a *App) routes() http.Handler {
	mux := http.NewServeMux()
	ep := a.endpoints
	// Every route with a token: authenticate, then count the request in
	// the token's rate (a refusal there is the cheapest: one statement, no
	// slot), then in its in-flight cap, then the route's own limits.
	api := func(h http.Handler) http.Handler { return a.requireToken(a.rateLimited(a.inflight.Handler(h))) }
	heavyRoute := func(e *heavy.Limiter, h http.HandlerFunc) http.Handler { return api(e.Handler(h)) }
	// History reads may be served by the read replica.
	historyRoute := func(e *heavy.Limiter, h http.HandlerFunc) http.Handler {
		return api(e.Handler(a.router.Handler(h)))
	}

	mux.Handle("POST /api/session", a.signin.Handler(http.HandlerFunc(a.handleSession)))
	mux.Handle("POST /api/plugins", api(a.uploads.Handler(http.HandlerFunc(a.handlePlugin))))
	mux.Handle("POST /api/sql", heavyRoute(ep.sqlConsole, a.handleConsole))
	mux.Handle("GET /api/audit/export", historyRoute(ep.export, a.handleExport))
	mux.Handle("GET /api/flow", historyRoute(ep.flow, a.handleFlow))
	mux.Handle("GET /api/audit", historyRoute(ep.audit, a.auditHistory().handler(a)))
	mux.Handle("GET /api/events", historyRoute(ep.events, a.eventHistory().handler(a)))
	mux.Handle("GET /api/alerts", historyRoute(ep.alerts, a.alertHistory().handler(a)))
	mux.Handle("GET /audit", a.pageToken(auditSignInForm, historyRoute(ep.audit, a.handleAuditPage)))
	mux.HandleFunc("POST /audit", a.handleAuditSignIn)
	mux.Handle("GET /api/nodes/{node}/queues", api(http.HandlerFunc(a.handleQueues)))
	mux.Handle("GET /api/limits", api(requireOperator(http.HandlerFunc(a.handleLimits))))
	mux.Handle("DELETE /api/limits/sign-in/{username}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleSignInReset)))))
	// The operator page: the page, its self-refreshing part, its form and
	// its script.
	mux.Handle("GET /limits", a.pageToken(limitsSignInForm, api(requireOperator(http.HandlerFunc(a.handleLimitsPage)))))
	mux.Handle("GET /limits/live", a.pageToken(nil, api(requireOperator(http.HandlerFunc(a.handleLimitsLive)))))
	mux.HandleFunc("POST /limits", a.handleLimitsSignIn)
	mux.Handle("POST /limits/sign-in/reset", crossOrigin.Handler(a.pageToken(nil, api(requireOperator(http.HandlerFunc(a.handleSignInResetForm))))))
	mux.HandleFunc("GET /limits/refresh.js", handleLimitsScript)

	mux.HandleFunc("GET /healthz", a.handleHealthz)
	mux.HandleFunc("GET /readyz", a.handleReadyz)
	mux.Handle("GET /metrics", a.metricsHandler())
	return problemMux{mux}
}

// readBounded runs fn in a bounded, read-only transaction on the pool read
// routing chose for the request (the read replica when it answers), moving
// to the primary when the replica fails mid-request. It reports whether the
// replica served the read.
func (a *App) readBounded(ctx context.Context, fn func(tx pgx.Tx) error) (mayLag bool, err error) {
	err = readroute.Read(ctx, func(pool *pgxpool.Pool, _ bool) error {
		return heavy.Read(ctx, pool, fn)
	})
	return readroute.MayLag(ctx), err
}

// registered reports whether this replica's heartbeat in the registry is
// current (not yet written, failing, or draining: not registered).
func (a *App) registered() (bool, string) {
	if a.registry.Ready() {
		return true, ""
	}
	return false, "not registered"
}
