package app

import (
	"errors"
	"fmt"
	"math"
	"net/http"
	"strings"
	"time"

	"github.com/pglimit/pglimit/clientaddr"
	mratelimit "github.com/pglimit/pglimit/middleware/ratelimit"
	"github.com/pglimit/pglimit/middleware/rules"
	"github.com/pglimit/pglimit/problem"
	"github.com/pglimit/pglimit/ratelimit"
)

// Proxies is -trusted-proxies: comma-separated CIDRs or addresses whose
// Forwarded / X-Forwarded-For is believed.
type Proxies []string

func (p *Proxies) String() string { return strings.Join(*p, ",") }

// Set adds the entries of a comma-separated list, checked as
// clientaddr.New checks them.
func (p *Proxies) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if _, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{s}}); err != nil {
			return fmt.Errorf("%q is not an address or CIDR", s)
		}
		*p = append(*p, s)
	}
	return nil
}

// setupAddress builds the client address resolver (-trusted-proxies,
// -client-address-header, -ipv6-prefix) and the rate of requests without a token per client
// address (-address-rate, -address-burst; none at 0).
func (a *App) setupAddress() error {
	cfg := a.cfg
	var err error
	if a.addrs, err = clientaddr.New(clientaddr.Options{TrustedProxies: cfg.TrustedProxies, IPv6Prefix: cfg.IPv6Prefix,
		Header: cfg.ClientAddressHeader}); err != nil {
		return err
	}
	if cfg.AddressRate.Limit == 0 {
		return nil
	}
	a.addrRate, err = ratelimit.New(a.primary, ratelimit.Options{
		Name: "address",
		Policies: []ratelimit.Policy{{Name: "address", Limit: cfg.AddressRate.Limit, Window: cfg.AddressRate.Window,
			Burst: cfg.AddressBurst}},
		Ban:           a.bans,
		QualifiedKey:  addressBanKey,
		Overrides:     a.overrides,
		Logger:        a.log,
		MeterProvider: a.meters,
		DryRun:        cfg.DryRun["address"],
	})
	if err != nil {
		return err
	}
	a.addrRateHTTP, err = mratelimit.New(mratelimit.Options{Limiter: a.addrRate, Key: a.clientKey,
		Exempt: rules.Allowed, OnError: a.addressError, Logger: a.log})
	return err
}

// addressLimited counts a request without a token in its client address's
// rate, when there is one.
func (a *App) addressLimited(next http.Handler) http.Handler {
	if a.addrRate == nil {
		return next
	}
	return a.addrRateHTTP.Handler(next)
}

// anonymous answers a request without a valid token: 401 unauthorized
// with detail, once the request has passed its address's rate.
func (a *App) anonymous(w http.ResponseWriter, r *http.Request, detail string) {
	a.addressLimited(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { unauthorized(w, detail) })).ServeHTTP(w, r)
}

// addressError answers what the address rate could not decide as the
// route would: a sign-in with 503 sign-in-unavailable, anything else as
// rateError does.
func (a *App) addressError(w http.ResponseWriter, r *http.Request, err error) {
	var e *ratelimit.LimitError
	if !errors.As(err, &e) && r.URL.Path == "/api/session" {
		a.signInUnavailable(w, r, err)
		return
	}
	rateError("address")(w, r, err)
}

// rateError is the OnError of a rate limit whose refusal names its scope
// (`user` or `address`): mratelimit.WriteError's 429 too-many-requests,
// with the member scope. Anything else (a banned key's 429 banned
// included) is WriteError's.
func rateError(scope string) func(http.ResponseWriter, *http.Request, error) {
	return func(w http.ResponseWriter, r *http.Request, err error) {
		var e *ratelimit.LimitError
		if !errors.As(err, &e) || e.Banned {
			// A banned key's refusal is WriteError's 429 banned.
			mratelimit.WriteError(w, r, err)
			return
		}
		mratelimit.SetHeaders(w.Header(), e.Policies)
		ext := map[string]any{"limit": e.Limit, "violated-policies": e.Violated, "scope": scope}
		d := &problem.Details{
			Slug: "too-many-requests", Title: "Too many requests", Status: http.StatusTooManyRequests,
			Instance: r.URL.Path, Extensions: ext,
		}
		if e.RetryAfter > 0 {
			retry := max(1, int(math.Ceil(e.RetryAfter.Seconds())))
			d.RetryAfter = time.Duration(retry) * time.Second
			ext["retryAfter"] = retry
			d.Detail = fmt.Sprintf("The rate of policy %s is spent; retry in %d s.", strings.Join(e.Violated, ", "), retry)
		} else {
			d.Detail = fmt.Sprintf("This request costs %d, more than policy %s allows at once; it can never pass.",
				e.Cost, strings.Join(e.Violated, ", "))
		}
		problem.Write(w, d)
	}
}
