package app

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/pglimit/pglimit/cmd/studio/internal/studiodb"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/problem"
)

// crossOrigin refuses a state-changing request that a browser says comes
// from another site (Sec-Fetch-Site, Origin): an operator's reset may not
// be forged by a page an operator happens to visit. (The page's cookie is
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

// resetSignIn clears username's throttle (signin.Limiter.Reset: the row
// goes and every replica forgets the refusal within a second) and records
// the audit event limits.reset. It answers the request itself when it
// fails.
func (a *App) resetSignIn(w http.ResponseWriter, r *http.Request, username string) (int, bool) {
	name := signin.NormalizeUsername(username)
	if name == "" || len(name) > 256 {
		badRequest(w, "invalid-username", "Invalid username", "Give the username whose sign-in throttle to clear.")
		return 0, false
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	failures, err := a.signin.Reset(ctx, "username:"+name)
	if err != nil {
		a.dbError(w, r, err)
		return 0, false
	}
	id, _ := IdentityFrom(r.Context())
	detail, _ := json.Marshal(map[string]any{"limit": "sign-in", "username": name, "failures": failures})
	actx, acancel := context.WithTimeout(context.WithoutCancel(r.Context()), 5*time.Second)
	defer acancel()
	if err := a.q.AuditEventRecord(actx, a.primary, &studiodb.AuditEventRecordParams{
		Actor: id.Username, Action: "limits.reset", Target: "login_attempt", Detail: detail,
	}); err != nil {
		a.log.WarnContext(actx, "limits.reset event not recorded", "err", err)
	}
	a.log.InfoContext(r.Context(), "sign-in throttle reset", "operator", id.Username, "username", name, "failures", failures)
	return failures, true
}

// Username is the username of a throttle keyed by one (the service keys
// the throttle "username:" and the normalised username), for the page's
// reset button; "" for any other key.
func (t throttleRow) Username() string {
	if u, ok := strings.CutPrefix(t.Key, "username:"); ok {
		return u
	}
	return ""
}
