package app

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"net/http"

	"github.com/pglimit/pglimit/override"
	"github.com/pglimit/pglimit/problem"
	"github.com/pglimit/pglimit/quota"
)

// overridePolicies are the policies an operator may give a key its own
// limit under (PUT /api/limits/overrides/{policy}/{key}), with the largest
// limit each takes: the rates' (requests per their window, package
// ratelimit's bound) and the quotas' (package quota's).
var overridePolicies = map[string]int64{
	"api":             1_000_000,
	"address":         1_000_000,
	policyQuota:       quota.MaxLimit,
	policyExportRows:  quota.MaxLimit,
	policyPluginBytes: quota.MaxLimit,
}

// overridePolicyOrder lists overridePolicies in the order the API lists
// their overrides.
var overridePolicyOrder = []string{"api", "address", policyQuota, policyExportRows, policyPluginBytes}

// overridesListMax bounds GET /api/limits/overrides and the operator
// page's list.
const overridesListMax = 1000

// setupOverrides loads the overrides (package override) every limit of
// overridePolicies reads its keys' limits from. It runs before the limits
// are made; Run keeps them current.
func (a *App) setupOverrides(ctx context.Context) error {
	var err error
	if a.overrides, err = override.New(ctx, a.primary, override.Options{Logger: a.log}); err != nil {
		return err
	}
	return nil
}

// overrideJSON is an override as the API shows it.
type overrideJSON struct {
	Policy string `json:"policy"`
	Key    string `json:"key"`
	Limit  int64  `json:"limit"`
}

// invalidOverride answers 400 invalid-override naming the field at fault.
func invalidOverride(w http.ResponseWriter, r *http.Request, field, detail string) {
	problem.Write(w, &problem.Details{Slug: "invalid-override", Title: "Invalid override", Status: http.StatusBadRequest,
		Detail: detail, Instance: r.URL.Path, Extensions: map[string]any{"field": field}})
}

// overrideTarget is the policy and key of an override route, or false
// after answering 404 (an unknown policy) or 400 (a key that is none of
// the service's forms).
func overrideTarget(w http.ResponseWriter, r *http.Request) (policy, key string, ok bool) {
	policy, key = r.PathValue("policy"), r.PathValue("key")
	if _, known := overridePolicies[policy]; !known {
		problem.Write(w, &problem.Details{Slug: "unknown-policy", Title: "Unknown policy", Status: http.StatusNotFound,
			Detail: "There is no policy of this name: api, address, quota, export-rows or plugin-bytes.", Instance: r.URL.Path})
		return "", "", false
	}
	if !validBanKey(key) {
		invalidOverride(w, r, "key", "The key is user:NAME, token:ID or address:ADDR.")
		return "", "", false
	}
	return policy, key, true
}

// handleOverrideSet is PUT /api/limits/overrides/{policy}/{key} {"limit"}:
// an operator gives a key its own limit under a policy, in force on every
// replica within a second (204; audit event limits.override).
func (a *App) handleOverrideSet(w http.ResponseWriter, r *http.Request) {
	policy, key, ok := overrideTarget(w, r)
	if !ok {
		return
	}
	var body map[string]json.RawMessage
	if !decodeJSON(w, r, &body, 1024) {
		return
	}
	for field := range body {
		if field != "limit" {
			invalidOverride(w, r, field, fmt.Sprintf("An override has no member %q: it has limit.", field))
			return
		}
	}
	most := overridePolicies[policy]
	var limit float64
	raw, has := body["limit"]
	if !has || string(raw) == "null" || json.Unmarshal(raw, &limit) != nil || limit != math.Trunc(limit) || limit < 0 || limit > float64(most) {
		invalidOverride(w, r, "limit", fmt.Sprintf("limit is a whole number from 0 (nothing allowed) to %d.", most))
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	_, err := a.overrides.Set(ctx, policy, key, int64(limit), 0)
	a.auditOverride(r, map[string]any{"op": "set", "policy": policy, "key": key, "limit": int64(limit)}, err)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	id, _ := IdentityFrom(r.Context())
	a.log.InfoContext(r.Context(), "override set", "operator", id.Username, "policy", policy, "key", key, "limit", int64(limit))
	w.WriteHeader(http.StatusNoContent)
}

// handleOverrideRemove is DELETE /api/limits/overrides/{policy}/{key}: the
// key has its policy's limit again on every replica within a second (204;
// 404 when it had no override; audit event limits.override).
func (a *App) handleOverrideRemove(w http.ResponseWriter, r *http.Request) {
	policy, key, ok := overrideTarget(w, r)
	if !ok {
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	removed, err := a.overrides.Remove(ctx, policy, key)
	if err == nil && !removed {
		problem.Write(w, &problem.Details{Slug: "not-found", Title: "Not found", Status: http.StatusNotFound,
			Detail: "This key has no override under this policy.", Instance: r.URL.Path})
		return
	}
	a.auditOverride(r, map[string]any{"op": "remove", "policy": policy, "key": key}, err)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	id, _ := IdentityFrom(r.Context())
	a.log.InfoContext(r.Context(), "override removed", "operator", id.Username, "policy", policy, "key", key)
	w.WriteHeader(http.StatusNoContent)
}

// handleOverrideList is GET /api/limits/overrides: every override in force,
// by policy and key (at most overridesListMax).
func (a *App) handleOverrideList(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	items, err := a.listOverrides(ctx, overridesListMax)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items})
}

// listOverrides reads at most max overrides in force, by policy (in
// overridePolicyOrder) and key.
func (a *App) listOverrides(ctx context.Context, max int) ([]overrideJSON, error) {
	items := []overrideJSON{}
	for _, policy := range overridePolicyOrder {
		for after := ""; len(items) < max; {
			page, err := a.overrides.List(ctx, policy, after, max-len(items))
			if err != nil {
				return nil, err
			}
			for _, o := range page {
				items = append(items, overrideJSON{Policy: o.Policy, Key: o.Key, Limit: o.Limit})
			}
			if len(page) == 0 || len(items) >= max {
				break
			}
			after = page[len(page)-1].Key
		}
	}
	return items, nil
}

// auditOverride records the audit event limits.override of a change an
// operator asked for, failed ones too.
func (a *App) auditOverride(r *http.Request, event map[string]any, err error) {
	a.auditChange(r, "limits.override", "limit_override", event, err)
}
