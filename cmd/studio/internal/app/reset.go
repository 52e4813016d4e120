package app

import (
	"context"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/problem"
)

// crossOrigin refuses a state-changing request that a browser says comes
// from another site (Sec-Fetch-Site, Origin): an operator's reset may not
// be forged by a page an operator happens to visit, nor a page's sign-in
// form be posted by another site to sign the browser in as its attacker. (The page's cookie is
// SameSite=Strict too; an API client with a bearer token sends neither
// header and passes.)
var crossOrigin = func() *http.CrossOriginProtection {
	c := http.NewCrossOriginProtection()
	c.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		problem.Write(w, &problem.Details{Slug: "cross-origin-request", Title: "Cross-origin request", Status: http.StatusForbidden,
			Detail: "This request changes state and came from another site; it is refused."})
	}))
	return c
}()

// handleSignInReset is DELETE /api/limits/sign-in/{username}: an operator
// clears a username's sign-in throttle on every replica (204).
func (a *App) handleSignInReset(w http.ResponseWriter, r *http.Request) {
	if _, ok := a.resetSignIn(w, r, r.PathValue("username")); ok {
		w.WriteHeader(http.StatusNoContent)
	}
}

// handleSignInResetForm is POST /limits/sign-in/reset, the operator page's
// reset button (form field username); it sends the browser back to the
// page.
func (a *App) handleSignInResetForm(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	if _, ok := a.resetSignIn(w, r, r.PostFormValue("username")); ok {
		http.Redirect(w, r, "/limits?reset="+url.QueryEscape(signin.NormalizeUsername(r.PostFormValue("username"))), http.StatusSeeOther)
	}
}

// resetSignIn clears username's throttles — every pair of it (each client
// address and device it failed from) and, when on, its count over every
// client — and records one audit event limits.reset (resetThrottle):
// failures are the pairs', usernameFailures the count over every client.
// It answers the request itself when it fails.
func (a *App) resetSignIn(w http.ResponseWriter, r *http.Request, username string) (int, bool) {
	name := signin.NormalizeUsername(username)
	if name == "" || len(name) > 256 {
		badRequest(w, "invalid-username", "Invalid username", "Give the username whose sign-in throttle to clear.")
		return 0, false
	}
	event := map[string]any{"limit": "sign-in", "username": name}
	return a.resetThrottle(w, r, func(ctx context.Context) (int, error) {
		n, err := a.signin.Reset(ctx, name)
		if err != nil || a.signinUser == nil {
			return n, err
		}
		m, err := a.signinUser.Reset(ctx, name)
		event["usernameFailures"] = m
		return n, err
	}, name, event)
}

// handleSignInAddressReset is DELETE /api/limits/sign-in/address/{address}:
// an operator clears a client address's sign-in throttle on every replica
// (204), recorded as limits.reset as a username's is. The address is an
// IPv4 or IPv6 address, or an IPv6 prefix as the throttle lists it
// ("2001:db8:1:2::/64", no shorter than -ipv6-prefix); it is keyed as the
// service keys a client (an IPv6 address stands for its prefix). Anything
// else is 400 invalid-address; with -sign-in-address-failures 0, 404.
func (a *App) handleSignInAddressReset(w http.ResponseWriter, r *http.Request) {
	if a.signinAddr == nil {
		problem.Write(w, &problem.Details{Slug: "not-found", Title: "Not found", Status: http.StatusNotFound,
			Detail: "The sign-in throttle per client address is off (-sign-in-address-failures 0)."})
		return
	}
	key, ok := a.addressKeyOf(r.PathValue("address"))
	if !ok {
		badRequest(w, "invalid-address", "Invalid address",
			"Give the client address whose sign-in throttle to clear: an IPv4 or IPv6 address, or an IPv6 prefix as the throttle lists it.")
		return
	}
	reset := func(ctx context.Context) (int, error) { return a.signinAddr.Reset(ctx, key) }
	if _, ok := a.resetThrottle(w, r, reset, key, map[string]any{"limit": "sign-in-address", "address": key}); ok {
		w.WriteHeader(http.StatusNoContent)
	}
}

// addressKeyOf is the client key of an address an operator typed: an
// address without zone or port, or an IPv6 prefix at least -ipv6-prefix
// long, keyed as clientKey keys a peer.
func (a *App) addressKeyOf(s string) (string, bool) {
	if s == "" || len(s) > 64 {
		return "", false
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		if !p.Addr().Is6() || p.Addr().Is4In6() || p.Bits() < a.cfg.IPv6Prefix {
			return "", false
		}
		s = p.Masked().Addr().String()
	} else if addr, err := netip.ParseAddr(s); err != nil || addr.Zone() != "" {
		return "", false
	}
	k, err := a.addrs.Key(s, nil)
	return k, err == nil && k != ""
}

// resetThrottle runs reset, an operator's reset of a sign-in throttle
// (signin.Limiter.Reset: the rows go and every replica forgets the
// refusal within a second), and records the audit event limits.reset
// with event's members and the failures, for every reset an operator
// asked for: of a key that had no failures (failures 0), and of one that
// failed, with the reason (client-gone, database-unavailable, error; the
// throttle may then be cleared or not: Reset fails too when the row went
// but the replicas could not be told). key names it in the log. It answers
// the request itself when it fails.
func (a *App) resetThrottle(w http.ResponseWriter, r *http.Request, reset func(context.Context) (int, error), key string, event map[string]any) (int, bool) {
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	failures, err := reset(ctx)
	id, _ := IdentityFrom(r.Context())
	event["failures"] = failures
	a.auditChange(r, "limits.reset", "login_attempt", event, err)
	if err != nil {
		a.dbError(w, r, err)
		return 0, false
	}
	a.log.InfoContext(r.Context(), "sign-in throttle reset", "operator", id.Username, "key", key, "failures", failures)
	return failures, true
}

// Username is the username of a throttle keyed by one ("username:" and
// the normalised username, or a pair: "pair:", the username, "|" and the
// client), for the page's reset button; "" for any other key.
func (t throttleRow) Username() string {
	if u, ok := strings.CutPrefix(t.Key, "username:"); ok {
		return u
	}
	if p, ok := strings.CutPrefix(t.Key, "pair:"); ok {
		if i := strings.LastIndex(p, "|"); i > 0 {
			return p[:i]
		}
	}
	return ""
}
