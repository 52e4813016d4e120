package app

import (
	"context"
	"net/http"

	"github.com/pglimit/pglimit/middleware/heavy"
)

// routes is the contract of REFERENCE-SERVICE.md.
func (a *App) routes() http.Handler {
	mux := http.NewServeMux()
	ep := a.endpoints
	api := func(h http.Handler) http.Handler { return a.requireToken(h) }
	heavyRoute := func(e heavy.Endpoint, h http.HandlerFunc) http.Handler { return api(a.heavy.Handler(e, h)) }

	mux.Handle("POST /api/sql", heavyRoute(ep.sqlConsole, a.handleConsole))
	mux.Handle("GET /api/audit/export", heavyRoute(ep.export, a.handleExport))
	mux.Handle("GET /api/flow", heavyRoute(ep.flow, a.handleFlow))
	mux.Handle("GET /api/limits", api(http.HandlerFunc(a.handleLimits)))

	mux.HandleFunc("GET /healthz", a.handleHealthz)
	mux.HandleFunc("GET /readyz", a.handleReadyz)
	mux.Handle("GET /metrics", a.metricsHandler())
	return problemMux{mux}
}

// readDB is the pool history reads use, and whether it may lag.
func (a *App) readDB(ctx context.Context) (heavy.Beginner, bool) {
	return a.primary, false
}

func mayLag(ctx context.Context) bool { return false }

func (a *App) registered() (bool, string) { return true, "" }
