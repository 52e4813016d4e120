// Package rules is the HTTP side of the allow and deny lists (package
// access): a Guard answers a request on the deny list 403 problem+json of
// type ...:denied before any other work, and marks one on the allow list
// so that the limiters after it exempt it (Allowed; middleware/ratelimit's
// Options.Exempt, and so its bans; middleware/signin's Options.Exempt for
// an address's sign-in throttle).
//
// What it guarantees: a request whose client address or any of whose keys
// a deny rule matches never reaches next; deny wins over allow. The lists
// are the access.Rules given to New, in force on every replica within
// about a second of a change.
//
// What it costs: no statement and no allocation for a request on no list
// (access.Rules.Match, tens of nanoseconds at 10,000 rules), plus what
// Options.Addr and Options.Keys cost; a request on the allow list gets a
// context value (one allocation).
//
// Where it goes: outermost, before authentication, for the address
// (Options.Keys returns nothing yet), and again after the authentication
// for the keys it found (a user, a token). Each denial is counted in
// pglimit.decisions (limit Options.Name, outcome refused, scope address or
// key); no key is ever an attribute. A Guard is safe for concurrent use.
package rules

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"

	"go.opentelemetry.io/otel/metric"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/internal/observe"
	"github.com/pglimit/pglimit/problem"
)

// Options configure a Guard. The zero value is ready to use.
type Options struct {
	// Name is the attribute limit of the Guard's decisions. Default
	// "access".
	Name string
	// Addr returns the request's client address (clientaddr behind
	// trusted proxies). Default: the peer, RemoteAddr's host.
	Addr func(*http.Request) netip.Addr
	// Keys returns the request's keys as the rules name them
	// ("user:alice", "token:42"); nil when it has none yet. Default: none.
	Keys func(*http.Request) []string
	// OnDeny writes the answer to a denied request. Default WriteError.
	OnDeny func(http.ResponseWriter, *http.Request)
	// DryRun lets denied requests through: counted with outcome
	// "dry-run-refused" and logged (a line a second at most). Default
	// false.
	DryRun bool
	// MeterProvider gives the meter of pglimit.decisions. Default
	// otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
}

// Guard answers requests on the deny list and marks those on the allow
// list.
type Guard struct {
	rules  *access.Rules
	addr   func(*http.Request) netip.Addr
	keys   func(*http.Request) []string
	onDeny func(http.ResponseWriter, *http.Request)
	obs    *observe.Limit
}

// Scopes of the Guard's decisions.
const (
	scopeAddress = "address"
	scopeKey     = "key"
)

// New returns a Guard over rules. It checks opts once, here.
func New(rules *access.Rules, opts Options) (*Guard, error) {
	if rules == nil {
		return nil, errors.New("rules: nil access.Rules")
	}
	if opts.Name == "" {
		opts.Name = "access"
	}
	if opts.Addr == nil {
		opts.Addr = peer
	}
	if opts.OnDeny == nil {
		opts.OnDeny = WriteError
	}
	obs, err := observe.New(observe.Options{Name: opts.Name, Scopes: []string{scopeAddress, scopeKey},
		DryRun: opts.DryRun, MeterProvider: opts.MeterProvider})
	if err != nil {
		return nil, err
	}
	return &Guard{rules: rules, addr: opts.Addr, keys: opts.Keys, onDeny: opts.OnDeny, obs: obs}, nil
}

// peer is RemoteAddr's address.
func peer(r *http.Request) netip.Addr {
	if ap, err := netip.ParseAddrPort(r.RemoteAddr); err == nil {
		return ap.Addr()
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	a, _ := netip.ParseAddr(host)
	return a
}

type allowedKey struct{}

// Allowed reports whether a Guard found r on the allow list (and on no
// deny list): the exemption a limiter's Options.Exempt takes.
func Allowed(r *http.Request) bool {
	ok, _ := r.Context().Value(allowedKey{}).(bool)
	return ok
}

// Handler answers a denied request with OnDeny and passes any other to
// next, marked Allowed when an allow rule matched it.
func (g *Guard) Handler(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		addr := g.addr(r)
		var keys []string
		if g.keys != nil {
			keys = g.keys(r)
		}
		switch g.rules.Match(addr, keys...) {
		case access.Deny:
			scope := scopeAddress
			if len(keys) > 0 && g.rules.Match(addr) != access.Deny {
				scope = scopeKey
			}
			g.obs.Refused(r.Context(), scope, addr.String())
			if !g.obs.DryRun() {
				g.onDeny(w, r)
				return
			}
		case access.Allow:
			if !Allowed(r) {
				r = r.WithContext(context.WithValue(r.Context(), allowedKey{}, true))
			}
		}
		next.ServeHTTP(w, r)
	})
}

// WriteError answers 403 problem+json of type ...:denied. No Retry-After:
// only an operator lifts a deny rule.
func WriteError(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, &problem.Details{Slug: "denied", Title: "Denied", Status: http.StatusForbidden,
		Detail: "This client is on the deny list.", Instance: r.URL.Path})
}
