package ratelimit_test

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/ban"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/override"
	"github.com/pglimit/pglimit/ratelimit"
)

// options is what a test configures: the engine's Options and its HTTP
// face's (middleware/ratelimit), side by side. Key nil builds no
// middleware: the test calls the engine alone.
type options struct {
	// The engine's (ratelimit.Options).
	Name          string
	Policies      []ratelimit.Policy
	FailOpen      bool
	DryRun        bool
	Timeout       time.Duration
	Borrow        bool
	Shares        int
	Ban           *ban.Bans
	Overrides     *override.Store
	QualifiedKey  func(string) string
	Logger        *slog.Logger
	MeterProvider metric.MeterProvider
	// The middleware's (mratelimit.Options).
	Key        func(*http.Request) (string, bool)
	PolicyFunc func(*http.Request, string) []ratelimit.Policy
	Exempt     func(*http.Request) bool
	Cost       func(*http.Request) int
	OnError    func(http.ResponseWriter, *http.Request, error)
}

// limiter is an engine and, when options had a Key, its middleware.
type limiter struct {
	*ratelimit.Limiter
	mw *mratelimit.Middleware
}

// Handler is the middleware's Handler.
func (l *limiter) Handler(next http.Handler) http.Handler { return l.mw.Handler(next) }

// build makes the engine of o and, when o has a Key or a PolicyFunc, its
// middleware.
func build(pool *pgxpool.Pool, o options) (*limiter, error) {
	e, err := ratelimit.New(pool, ratelimit.Options{Name: o.Name, Policies: o.Policies, FailOpen: o.FailOpen, DryRun: o.DryRun,
		Timeout: o.Timeout, Borrow: o.Borrow, Shares: o.Shares, Ban: o.Ban, Overrides: o.Overrides, QualifiedKey: o.QualifiedKey,
		Logger: o.Logger, MeterProvider: o.MeterProvider})
	if err != nil {
		return nil, err
	}
	l := &limiter{Limiter: e}
	if o.Key == nil && o.PolicyFunc == nil && o.Exempt == nil && o.Cost == nil && o.OnError == nil {
		return l, nil
	}
	l.mw, err = mratelimit.New(mratelimit.Options{Limiter: e, Key: o.Key, PolicyFunc: o.PolicyFunc, Exempt: o.Exempt,
		Cost: o.Cost, OnError: o.OnError, Logger: o.Logger})
	if err != nil {
		return nil, err
	}
	return l, nil
}
