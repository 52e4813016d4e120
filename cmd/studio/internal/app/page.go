package app

import (
	_ "embed"
	"errors"
	"html/template"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

//go:embed audit.html
var auditHTML string

var auditPage = template.Must(template.New("audit").Funcs(template.FuncMap{
	"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
}).Parse(auditHTML))

// tokenCookie carries the API token of the HTML page; it is HttpOnly and
// SameSite=Strict, Secure when the page was served over TLS, and only the
// page reads it.
const tokenCookie = "studio_token"

type auditView struct {
	SignIn   bool
	Error    string
	Items    []auditItem
	Total    int64
	Capped   bool
	Page     int
	Size     int
	Keyset   bool
	MayLag   bool
	PrevURL  string
	NextURL  string
	OlderURL string
	FirstRow int
	LastRow  int
}

// handleAuditPage is GET /audit: the audit history as a server-rendered
// page, paged by page number over the first rows and then by cursor, with
// a notice when the rows came from the read replica.
func (a *App) handleAuditPage(w http.ResponseWriter, r *http.Request) {
	q, ok := a.parseHistory(w, r, "audit-history")
	if !ok {
		return
	}
	resp, err := a.auditHistory().read(r.Context(), a, q)
	if err != nil {
		a.heavyError(w, r, err)
		return
	}
	v := auditView{Items: resp.Items, Page: q.page.Number, Size: q.page.Size, Keyset: q.page.After != nil, MayLag: resp.MayLag}
	if resp.Total != nil {
		v.Total, v.Capped = *resp.Total, resp.TotalCapped
	}
	link := func(set url.Values) string {
		u := url.Values{}
		for k, vs := range r.URL.Query() {
			if k != "page" && k != "after" {
				u[k] = vs
			}
		}
		for k, vs := range set {
			u[k] = vs
		}
		return "/audit?" + u.Encode()
	}
	if !v.Keyset {
		v.FirstRow = q.page.Offset() + 1
		v.LastRow = q.page.Offset() + len(resp.Items)
		if v.Page > 1 {
			v.PrevURL = link(url.Values{"page": {strconv.Itoa(v.Page - 1)}})
		}
		if resp.Next != nil {
			if (v.Page+1)*v.Size <= a.cfg.HistoryRows {
				v.NextURL = link(url.Values{"page": {strconv.Itoa(v.Page + 1)}})
			} else {
				v.OlderURL = link(url.Values{"after": {*resp.Next}})
			}
		}
	} else if resp.Next != nil {
		v.OlderURL = link(url.Values{"after": {*resp.Next}})
	}
	renderPage(w, http.StatusOK, v)
}

func renderPage(w http.ResponseWriter, status int, v auditView) {
	writeHTML(w, status, pageCSP, func(w io.Writer) error { return auditPage.Execute(w, v) })
}

// pageCSP is the Content-Security-Policy of the pages without a script.
const pageCSP = "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'"

// writeHTML answers an HTML page: never cached, never framed, under csp.
func writeHTML(w http.ResponseWriter, status int, csp string, render func(io.Writer) error) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", csp)
	w.Header().Set("X-Frame-Options", "DENY")
	w.WriteHeader(status)
	_ = render(w)
}

// handleAuditSignIn is POST /audit: it takes an API token from the page's
// form, checks it, and keeps it in the page's cookie.
func (a *App) handleAuditSignIn(w http.ResponseWriter, r *http.Request) {
	a.pageSignIn(w, r, "/audit", false, func(status int, msg string) {
		renderPage(w, status, auditView{SignIn: true, Error: msg})
	})
}

// pageSignIn takes an API token from a page's form (its route refuses a
// cross-origin post: crossOrigin), checks it (and that
// its user is an operator, when operatorOnly), keeps it in the cookie of
// the page at path and sends the browser there; a token it cannot accept
// shows the form again through form.
func (a *App) pageSignIn(w http.ResponseWriter, r *http.Request, path string, operatorOnly bool, form func(status int, msg string)) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || len(token) > 256 {
		form(http.StatusUnauthorized, "Enter an API token.")
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	row, err := a.q.ApiTokenLookup(ctx, a.primary, TokenDigest(token))
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		form(http.StatusUnauthorized, "That API token is unknown.")
		return
	case err != nil:
		// The token could not be checked: not "unknown", and not signed in.
		a.log.WarnContext(r.Context(), "page sign-in: token not checked", "page", path, "err", err)
		form(http.StatusServiceUnavailable, "The database cannot be reached; try again shortly.")
		return
	case operatorOnly && !row.Operator:
		form(http.StatusForbidden, "That API token is not an operator's: this page is for operators only.")
		return
	}
	// Secure when this connection is TLS. A proxy's X-Forwarded-Proto is not
	// believed: the service has no list of proxies it trusts, and anyone
	// may send that header.
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: token, Path: path, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil, MaxAge: 8 * 3600})
	http.Redirect(w, r, path, http.StatusSeeOther)
}

// pageToken lets the page's cookie stand in for the Authorization header;
// without either it shows the sign-in form (form), or, with a nil form,
// passes the request on as it is (requireToken answers 401).
func (a *App) pageToken(form func(http.ResponseWriter), next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			c, err := r.Cookie(tokenCookie)
			if (err != nil || c.Value == "") && form != nil {
				// A request without a token: under the address's rate.
				a.addressLimited(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { form(w) })).ServeHTTP(w, r)
				return
			}
			if err != nil || c.Value == "" {
				next.ServeHTTP(w, r)
				return
			}
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+c.Value)
		}
		next.ServeHTTP(w, r)
	})
}
