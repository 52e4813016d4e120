package app

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode/utf8"

	mquota "github.com/pglimit/pglimit/middleware/quota"
	"github.com/pglimit/pglimit/problem"
	"github.com/pglimit/pglimit/quota"
	"github.com/pglimit/pglimit/ratelimit"
)

// The quotas' policy names: in -dry-run, the metrics, the RateLimit
// headers, the quota-exhausted problem's policy member and
// /api/limits/keys/{policy}.
const (
	policyQuota       = "quota"
	policyExportRows  = "export-rows"
	policyPluginBytes = "plugin-bytes"
)

// quotas are the service's calendar quotas, each nil when its flag is 0.
type quotas struct {
	loc         *time.Location
	api         *quota.Limiter // -api-quota: requests per user per day or month
	apiHTTP     *mquota.Middleware
	exportRows  *quota.Limiter // -export-rows-per-day: reserved before an export, settled by the rows sent
	pluginBytes *quota.Limiter // -plugin-bytes-per-month: Durable, debited in the plugin's transaction
}

// setupQuotas builds the quotas the flags turn on, and checks once that
// PostgreSQL knows -quota-timezone too (a zone Go knows and the server
// does not would fail every charge): a start-up error naming the flag.
func (a *App) setupQuotas(ctx context.Context) error {
	cfg := a.cfg
	loc, err := cfg.quotaLocation()
	if err != nil {
		return err
	}
	a.quotas.loc = loc
	build := func(name string, limit int64, p quota.Period, durable bool) (*quota.Limiter, error) {
		if limit == 0 {
			return nil, nil
		}
		l, err := quota.New(a.primary, quota.Options{Name: name, Limit: limit, Period: p, Location: loc, Durable: durable,
			Overrides: a.overrides, DryRun: cfg.DryRun[name], MeterProvider: a.meters, Logger: a.log})
		if err != nil {
			return nil, fmt.Errorf("quota %s: %w", name, err)
		}
		pctx, cancel := dbContext(ctx)
		defer cancel()
		if _, err := l.Peek(pctx, "start-up check"); err != nil {
			if strings.Contains(err.Error(), "time zone") {
				return nil, fmt.Errorf("-quota-timezone: the database does not know time zone %q", loc)
			}
			return nil, fmt.Errorf("quota %s: %w", name, err)
		}
		return l, nil
	}
	if a.quotas.api, err = build(policyQuota, cfg.APIQuota.Limit, cfg.APIQuota.Period, false); err != nil {
		return err
	}
	if a.quotas.api != nil {
		if a.quotas.apiHTTP, err = mquota.New(mquota.Options{Limiter: a.quotas.api, Policy: policyQuota, Key: rateKeyOf, Logger: a.log}); err != nil {
			return err
		}
	}
	if a.quotas.exportRows, err = build(policyExportRows, cfg.ExportRowsPerDay, quota.Day, false); err != nil {
		return err
	}
	a.quotas.pluginBytes, err = build(policyPluginBytes, cfg.PluginBytesPerMonth, quota.Month, true)
	return err
}

// quotaLimited charges a request of an API token to an /api/ route to its
// user's calendar quota (-api-quota), when there is one; the operator and
// audit pages, which refresh themselves, are not charged.
func (a *App) quotaLimited(next http.Handler) http.Handler {
	if a.quotas.apiHTTP == nil {
		return next
	}
	charged := a.quotas.apiHTTP.Handler(next)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/api/") {
			charged.ServeHTTP(w, r)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// quotaKey is a user's key in every quota: "user:" and the username, as the
// API rate keys a user.
func quotaKey(username string) string { return "user:" + username }

// quotaError answers a refused or failed charge of a quota the handler made
// itself (export rows, plugin bytes): 429 quota-exhausted, or 503 for a
// database that could not decide (logged).
func (a *App) quotaError(w http.ResponseWriter, r *http.Request, err error) {
	var le *quota.LimitError
	if !errors.As(err, &le) {
		a.logFailure(r, err)
	}
	mquota.WriteError(w, r, err)
}

// keysPage is the most keys one page of /api/limits/keys lists.
const keysPage = 100

type quotaKeyJSON struct {
	Key       string    `json:"key"`
	Limit     int64     `json:"limit"`
	Remaining int64     `json:"remaining"`
	Reset     time.Time `json:"reset"`
}

// handleLimitKeys is GET /api/limits/keys/{policy}?after=, operators
// only: the keys with use in the policy's current period, in key order, a
// page of keysPage, with next (null on the last page) to pass back as
// after. It reads, never charges. An unknown policy, or one turned off, is
// 404; an after that is not a next of this route is 400 invalid-cursor.
func (a *App) handleLimitKeys(w http.ResponseWriter, r *http.Request) {
	policy := r.PathValue("policy")
	if rl, ok := map[string]*ratelimit.Limiter{"api": a.rate, "address": a.addrRate}[policy]; ok {
		a.rateKeys(w, r, policy, rl)
		return
	}
	l, known := map[string]*quota.Limiter{
		policyQuota: a.quotas.api, policyExportRows: a.quotas.exportRows, policyPluginBytes: a.quotas.pluginBytes,
	}[policy]
	if !known || l == nil {
		detail := fmt.Sprintf("No policy is named %q: the policies are api, address, quota, export-rows and plugin-bytes.", truncate(policy, 64))
		if known {
			detail = fmt.Sprintf("The quota %s is off on this installation.", policy)
		}
		problem.Write(w, &problem.Details{Slug: "unknown-policy", Title: "Unknown policy", Status: http.StatusNotFound, Detail: detail})
		return
	}
	after, ok := keysAfter(w, r)
	if !ok {
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	states, err := l.Keys(ctx, after, keysPage+1)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	items := make([]quotaKeyJSON, len(states))
	for i, s := range states {
		items[i] = quotaKeyJSON{Key: s.Key, Limit: s.Limit, Remaining: s.Remaining, Reset: s.Reset}
	}
	writeKeysPage(w, items, func(i int) string { return states[i].Key })
}

// writeKeysPage answers a page of GET /api/limits/keys/{policy} from up to
// keysPage+1 items read: the first keysPage, and next (null on the last
// page), the stored key of the last item listed, to pass back as after.
func writeKeysPage(w http.ResponseWriter, items []quotaKeyJSON, stored func(int) string) {
	var next *string
	if len(items) > keysPage {
		items = items[:keysPage]
		n := base64.RawURLEncoding.EncodeToString([]byte(stored(keysPage - 1)))
		next = &n
	}
	writeJSON(w, http.StatusOK, map[string]any{"items": items, "next": next})
}

// keysAfter is the after parameter of GET /api/limits/keys/{policy}: the
// key a page starts after ("" for the first), or false after answering
// 400 invalid-cursor.
func keysAfter(w http.ResponseWriter, r *http.Request) (string, bool) {
	vals, ok := r.URL.Query()["after"]
	if !ok {
		return "", true
	}
	raw, err := base64.RawURLEncoding.DecodeString(vals[0])
	if len(vals) != 1 || vals[0] == "" || len(vals[0]) > 1024 || err != nil || !utf8.Valid(raw) {
		badRequest(w, "invalid-cursor", "Invalid cursor", "after takes the next member of the previous page, as it was given.")
		return "", false
	}
	return string(raw), true
}

// rateKeys is GET /api/limits/keys/{policy} of the rates api and address
// (nil when its flag is 0: 404): the keys whose rate state still counts,
// as the overrides and bans name them (user:NAME, address:ADDR), with
// the limit, the remaining burst and when one more request is available
// (reset), consuming nothing.
func (a *App) rateKeys(w http.ResponseWriter, r *http.Request, policy string, l *ratelimit.Limiter) {
	if l == nil {
		problem.Write(w, &problem.Details{Slug: "unknown-policy", Title: "Unknown policy", Status: http.StatusNotFound,
			Detail: fmt.Sprintf("The rate %s is off on this installation.", policy)})
		return
	}
	after, ok := keysAfter(w, r)
	if !ok {
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	states, err := l.Keys(ctx, after, keysPage+1)
	if err != nil {
		a.dbError(w, r, err)
		return
	}
	now := time.Now()
	items := make([]quotaKeyJSON, 0, len(states))
	for _, s := range states {
		key := s.Key
		if policy == "address" {
			key = addressBanKey(key)
		}
		p := s.Policies[0]
		items = append(items, quotaKeyJSON{Key: key, Limit: int64(p.Limit), Remaining: int64(p.Remaining), Reset: now.Add(p.Reset).UTC().Truncate(time.Millisecond)})
	}
	writeKeysPage(w, items, func(i int) string { return states[i].Key })
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// handleLimitUsage is GET /api/limits/usage?user=: the user's exported
// rows of the current day and stored plugin bytes of the current month,
// in -quota-timezone, read without charging (null for a quota that is
// off). A user reads their own (user defaults to them); an operator
// anyone's; anyone else is 403 forbidden.
func (a *App) handleLimitUsage(w http.ResponseWriter, r *http.Request) {
	id, _ := IdentityFrom(r.Context())
	user := id.Username
	if vals, ok := r.URL.Query()["user"]; ok {
		if len(vals) != 1 || vals[0] == "" || len(vals[0]) > 256 || !utf8.ValidString(vals[0]) {
			badRequest(w, "invalid-user", "Invalid user", "user is a username, given once.")
			return
		}
		user = vals[0]
	}
	if user != id.Username && !id.Operator {
		problem.Write(w, &problem.Details{Slug: "forbidden", Title: "Forbidden", Status: http.StatusForbidden,
			Detail: "A user may read their own usage only."})
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	now := time.Now()
	resp := map[string]any{"user": user, "exportRows": nil, "pluginBytes": nil}
	day, month := now, now
	if l := a.quotas.exportRows; l != nil {
		st, err := l.Peek(ctx, quotaKey(user))
		if err != nil {
			a.dbError(w, r, err)
			return
		}
		resp["exportRows"], day = st.Used, st.PeriodStart
	}
	if l := a.quotas.pluginBytes; l != nil {
		st, err := l.Peek(ctx, quotaKey(user))
		if err != nil {
			a.dbError(w, r, err)
			return
		}
		resp["pluginBytes"], month = st.Used, st.PeriodStart
	}
	resp["day"] = day.In(a.quotas.loc).Format(time.DateOnly)
	resp["month"] = month.In(a.quotas.loc).Format("2006-01")
	writeJSON(w, http.StatusOK, resp)
}
