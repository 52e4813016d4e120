package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/middleware/rules"
	"github.com/pglimit/pglimit/problem"
)

// setupAccess loads the allow and deny lists (package access) and makes
// their guards: one outermost, by the client address alone, on every
// /api/ route and page; one after the authentication, by the address and
// the request's user and token (user:NAME, token:ID).
func (a *App) setupAccess(ctx context.Context) error {
	var err error
	if a.rules, err = access.New(ctx, a.primary, access.Options{Logger: a.log}); err != nil {
		return err
	}
	if a.denyByAddress, err = rules.New(a.rules, rules.Options{Addr: a.clientAddr, MeterProvider: a.meters}); err != nil {
		return err
	}
	a.denyByKey, err = rules.New(a.rules, rules.Options{Addr: a.clientAddr, Keys: identityKeys, MeterProvider: a.meters})
	return err
}

// clientAddr is the request's client address as the address limits key it
// (clientaddr): for IPv6 the first address of its -ipv6-prefix, which
// every rule matches as it matches the client's own address, since no
// IPv6 rule is narrower than that prefix (handleRuleAdd refuses them).
func (a *App) clientAddr(r *http.Request) netip.Addr {
	k, _ := a.clientKey(r)
	if strings.IndexByte(k, '/') >= 0 {
		p, _ := netip.ParsePrefix(k)
		return p.Addr()
	}
	addr, _ := netip.ParseAddr(k)
	return addr
}

// identityKeys are the keys the rules may name of an authenticated
// request: its user and its token.
func identityKeys(r *http.Request) []string {
	id, ok := IdentityFrom(r.Context())
	if !ok {
		return nil
	}
	return []string{"user:" + id.Username, "token:" + strconv.FormatInt(id.TokenID, 10)}
}

// ruleJSON is a rule as the API shows it.
type ruleJSON struct {
	ID        int64      `json:"id"`
	List      string     `json:"list"`
	Match     string     `json:"match"`
	ExpiresAt *time.Time `json:"expiresAt"`
}

func ruleOf(r access.Rule) ruleJSON {
	out := ruleJSON{ID: r.ID, List: r.List.String(), Match: r.Match}
	if !r.ExpiresAt.IsZero() {
		t := r.ExpiresAt.UTC()
		out.ExpiresAt = &t
	}
	return out
}

// invalidRule answers 400 invalid-rule naming the field at fault.
func invalidRule(w http.ResponseWriter, r *http.Request, field, detail string) {
	problem.Write(w, &problem.Details{Slug: "invalid-rule", Title: "Invalid rule", Status: http.StatusBadRequest,
		Detail: detail, Instance: r.URL.Path, Extensions: map[string]any{"field": field}})
}

// handleRuleAdd is POST /api/limits/rules {"list","match","expiresIn"}:
// an operator adds an allow or deny rule, in force on every replica
// within a second (201, audit event limits.rule).
func (a *App) handleRuleAdd(w http.ResponseWriter, r *http.Request) {
	var body map[string]json.RawMessage
	if !decodeJSON(w, r, &body, 4096) {
		return
	}
	var rule access.Rule
	for _, field := range []string{"list", "match", "expiresIn"} {
		raw, ok := body[field]
		delete(body, field)
		if !ok || string(raw) == "null" {
			if field == "expiresIn" {
				continue
			}
			invalidRule(w, r, field, fmt.Sprintf("The rule has no %s.", field))
			return
		}
		switch field {
		case "list":
			var s string
			if json.Unmarshal(raw, &s) != nil || (s != "allow" && s != "deny") {
				invalidRule(w, r, field, `list is "allow" or "deny".`)
				return
			}
			rule.List = access.Allow
			if s == "deny" {
				rule.List = access.Deny
			}
		case "match":
			if json.Unmarshal(raw, &rule.Match) != nil {
				invalidRule(w, r, field, "match is a string: an address, a CIDR, user:NAME or token:ID.")
				return
			}
		case "expiresIn":
			var secs float64
			if json.Unmarshal(raw, &secs) != nil || secs < 0 || math.IsInf(secs, 0) || secs > 100*365*24*3600 {
				invalidRule(w, r, field, "expiresIn is the seconds until the rule lapses, a number from 0 (never) to 100 years.")
				return
			}
			rule.ExpiresIn = time.Duration(secs * float64(time.Second))
		}
	}
	for field := range body {
		invalidRule(w, r, field, fmt.Sprintf("A rule has no member %q: it has list, match and expiresIn.", field))
		return
	}
	if field, detail := a.checkRule(rule.Match); field != "" {
		invalidRule(w, r, field, detail)
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	added, err := a.rules.Add(ctx, rule)
	var fe *access.FieldError
	if errors.As(err, &fe) {
		invalidRule(w, r, fe.Field, fe.Reason+".")
		return
	}
	event := map[string]any{"op": "add", "list": rule.List.String(), "match": rule.Match}
	if err == nil {
		event["id"], event["match"] = added.ID, added.Match
		if !added.ExpiresAt.IsZero() {
			event["expiresAt"] = added.ExpiresAt.UTC()
		}
	}
	a.auditRule(r, event, err)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	id, _ := IdentityFrom(r.Context())
	a.log.InfoContext(r.Context(), "access rule added", "operator", id.Username, "id", added.ID, "list", added.List.String(), "match", added.Match)
	writeJSON(w, http.StatusCreated, ruleOf(added))
}

// checkRule refuses what the library takes but this service cannot hold:
// a key of another kind than user: or token:, and an IPv6 rule narrower
// than -ipv6-prefix. (The service counts an IPv6 client as its
// -ipv6-prefix, so a narrower deny rule would be escaped by moving to
// another address of the same prefix, and a narrower allow rule would
// exempt neighbours it does not name: it is refused, not widened, so the
// operator decides.)
func (a *App) checkRule(match string) (field, detail string) {
	m := strings.TrimSpace(match)
	if strings.Trim(m, "0123456789abcdefABCDEF:./") != "" {
		if kind, _, _ := strings.Cut(m, ":"); kind != "user" && kind != "token" {
			return "match", "match is an address, a CIDR, user:NAME or token:ID."
		}
		return "", ""
	}
	var p netip.Prefix
	if strings.Contains(m, "/") {
		p, _ = netip.ParsePrefix(m)
	} else if addr, err := netip.ParseAddr(m); err == nil {
		p = netip.PrefixFrom(addr, addr.BitLen())
	}
	if p.IsValid() && p.Addr().Is6() && !p.Addr().Is4In6() && p.Bits() > a.cfg.IPv6Prefix {
		return "match", fmt.Sprintf("This service counts an IPv6 client as its /%d (-ipv6-prefix): a rule is at most that narrow; give %s.",
			a.cfg.IPv6Prefix, netip.PrefixFrom(p.Addr(), a.cfg.IPv6Prefix).Masked())
	}
	return "", ""
}

// handleRuleList is GET /api/limits/rules: every rule in force.
func (a *App) handleRuleList(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	list, err := a.rules.List(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	items := make([]ruleJSON, 0, len(list))
	for _, rule := range list {
		items = append(items, ruleOf(rule))
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// handleRuleRemove is DELETE /api/limits/rules/{id}: out of force on every
// replica within a second (204; 404 when there is no such rule; audit
// event limits.rule).
func (a *App) handleRuleRemove(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(r.PathValue("id"), 10, 64)
	if err != nil || id <= 0 {
		notFoundRule(w, r)
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	found, err := a.rules.Remove(ctx, id)
	if err == nil && !found {
		notFoundRule(w, r)
		return
	}
	a.auditRule(r, map[string]any{"op": "remove", "id": id}, err)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	op, _ := IdentityFrom(r.Context())
	a.log.InfoContext(r.Context(), "access rule removed", "operator", op.Username, "id", id)
	w.WriteHeader(http.StatusNoContent)
}

func notFoundRule(w http.ResponseWriter, r *http.Request) {
	problem.Write(w, &problem.Details{Slug: "not-found", Title: "Not found", Status: http.StatusNotFound,
		Detail: "There is no rule of this id.", Instance: r.URL.Path})
}

// auditRule records the audit event limits.rule of a change an operator
// asked for, failed ones too (failed, reason).
func (a *App) auditRule(r *http.Request, event map[string]any, err error) {
	a.auditChange(r, "limits.rule", "access_rule", event, err)
}

// auditChange records the audit event action (limits.rule,
// limits.override, limits.reset) of a change of target an operator asked
// for, failed ones too (members failed and reason: the same reasons as an
// export's). Its own failure is logged: the change stands.
func (a *App) auditChange(r *http.Request, action, target string, event map[string]any, err error) {
	if err != nil {
		event["failed"] = true
		event["reason"] = exportFailure(r, err)
	}
	id, _ := IdentityFrom(r.Context())
	detail, _ := json.Marshal(event)
	actx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer cancel()
	if err := a.q.AuditEventRecord(actx, a.primary, &studiodb.AuditEventRecordParams{
		Actor: id.Username, Action: action, Target: target, Detail: detail,
	}); err != nil {
		a.log.WarnContext(actx, action+" event not recorded", "err", err)
	}
}
