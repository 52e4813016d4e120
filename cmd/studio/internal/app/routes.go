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
	// Every route with a token: authenticate, then the deny list of its
	// user and token (no statement), then count the request in the
	// token's rate (a refusal there is the cheapest: one statement, no
	// slot), then in its in-flight cap, then in its user's calendar quota
	// (-api-quota: a request refused by a rate or the in-flight cap spends
	// none of it), then the route's own limits. The deny list of the
	// client address is in front of all of it (guarded).
	api := func(h http.Handler) http.Handler {
		return a.requireToken(a.denyByKey.Handler(a.rateLimited(a.inflight.Handler(a.quotaLimited(h)))))
	}
	heavyRoute := func(e *heavy.Limiter, h http.HandlerFunc) http.Handler { return api(e.Handler(h)) }
	// History reads may be served by the read replica.
	historyRoute := func(e *heavy.Limiter, h http.HandlerFunc) http.Handler {
		return api(e.Handler(a.router.Handler(h)))
	}

	mux.Handle("POST /api/session", a.addressLimited(a.signInLimited(http.HandlerFunc(a.handleSession))))
	mux.Handle("POST /api/plugins", api(a.uploads.Handler(http.HandlerFunc(a.handlePlugin))))
	mux.Handle("POST /api/sql", heavyRoute(ep.sqlConsole, a.handleConsole))
	mux.Handle("GET /api/audit/export", historyRoute(ep.export, a.handleExport))
	mux.Handle("GET /api/flow", historyRoute(ep.flow, a.handleFlow))
	mux.Handle("GET /api/audit", historyRoute(ep.audit, a.auditHistory().handler(a)))
	mux.Handle("GET /api/events", historyRoute(ep.events, a.eventHistory().handler(a)))
	mux.Handle("GET /api/alerts", historyRoute(ep.alerts, a.alertHistory().handler(a)))
	mux.Handle("GET /audit", a.pageToken(auditSignInForm, historyRoute(ep.audit, a.handleAuditPage)))
	// The pages' forms take a token in their body: requests without one,
	// under the address's rate (and its ban) before the token is looked up.
	mux.Handle("POST /audit", crossOrigin.Handler(a.addressLimited(http.HandlerFunc(a.handleAuditSignIn))))
	mux.Handle("GET /api/nodes/{node}/queues", api(http.HandlerFunc(a.handleQueues)))
	mux.Handle("GET /api/limits", api(requireOperator(http.HandlerFunc(a.handleLimits))))
	mux.Handle("POST /api/limits/rules", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleRuleAdd)))))
	mux.Handle("GET /api/limits/rules", api(requireOperator(http.HandlerFunc(a.handleRuleList))))
	mux.Handle("DELETE /api/limits/rules/{id}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleRuleRemove)))))
	// {key...}: an IPv6 prefix as the bans list it has a slash.
	mux.Handle("DELETE /api/limits/bans/{key...}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleBanLift)))))
	mux.Handle("DELETE /api/limits/sign-in/{username}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleSignInReset)))))
	// {address...}: an IPv6 prefix as the throttle lists it has a slash.
	mux.Handle("DELETE /api/limits/sign-in/address/{address...}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleSignInAddressReset)))))
	mux.Handle("PUT /api/limits/overrides/{policy}/{key...}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleOverrideSet)))))
	mux.Handle("DELETE /api/limits/overrides/{policy}/{key...}", crossOrigin.Handler(api(requireOperator(http.HandlerFunc(a.handleOverrideRemove)))))
	mux.Handle("GET /api/limits/overrides", api(requireOperator(http.HandlerFunc(a.handleOverrideList))))
	mux.Handle("GET /api/limits/keys/{policy}", api(requireOperator(http.HandlerFunc(a.handleLimitKeys))))
	mux.Handle("GET /api/limits/usage", api(http.HandlerFunc(a.handleLimitUsage)))
	// The operator page: the page, its self-refreshing part, its form and
	// its script.
	mux.Handle("GET /limits", a.pageToken(limitsSignInForm, api(requireOperator(http.HandlerFunc(a.handleLimitsPage)))))
	mux.Handle("GET /limits/live", a.pageToken(nil, api(requireOperator(http.HandlerFunc(a.handleLimitsLive)))))
	mux.Handle("POST /limits", crossOrigin.Handler(a.addressLimited(http.HandlerFunc(a.handleLimitsSignIn))))
	mux.Handle("POST /limits/sign-in/reset", crossOrigin.Handler(a.pageToken(nil, api(requireOperator(http.HandlerFunc(a.handleSignInResetForm))))))
	mux.Handle("GET /limits/refresh.js", a.addressLimited(http.HandlerFunc(handleLimitsScript)))

	mux.HandleFunc("GET /healthz", a.handleHealthz)
	mux.HandleFunc("GET /readyz", a.handleReadyz)
	mux.Handle("GET /metrics", a.metricsHandler())
	return a.guarded(problemMux{mux})
}

// readBounded runs fn in a bounded, read-only transaction on the pool read
// routing chose for the request (the read replica when it answers), moving
// to the primary when the replica fails mid-request. It reports whether the
// replica served the read.
func (a *App) readBounded(ctx context.Context, fn func(tx pgx.Tx) error) (mayLag bool, err error) {
	return readroute.Read(ctx, func(pool *pgxpool.Pool, _ bool) error {
		return heavy.Read(ctx, pool, fn)
	})
}

// registered reports whether this replica's heartbeat in the registry is
// current (not yet written, failing, or draining: not registered).
func (a *App) registered() (bool, string) {
	if a.registry.Ready() {
		return true, ""
	}
	return false, "not registered"
}
