package app

import (
	_ "embed"
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/cursor"
)

//go:embed audit.html
var auditHTML string

var auditPage = template.Must(template.New("audit").Funcs(template.FuncMap{
	"time": func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05") },
}).Parse(auditHTML))

// tokenCookie carries the API token of the HTML page; it is HttpOnly and
// SameSite=Strict, and only the page reads it.
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
	q, ok := a.parseHistory(w, r, a.endpoints.audit.Name())
	if !ok {
		return
	}
	resp, err := a.auditHistory().read(r.Context(), a, q)
	if err != nil {
		a.heavyError(w, r, err)
		return
	}
	v := auditView{Items: resp.Items, Page: q.page.Number, Size: q.page.Size, Keyset: q.page.Keyset(), MayLag: resp.MayLag}
	if resp.Total != nil {
		v.Total, v.Capped = *resp.Total, resp.TotalCapped
	}
	link := func(set url.Values) string {
		u := url.Values{}
		for k, vs := range r.URL.Query() {
			if k != cursor.ParamPage && k != cursor.ParamAfter {
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
			v.PrevURL = link(url.Values{cursor.ParamPage: {strconv.Itoa(v.Page - 1)}})
		}
		if resp.Next != nil {
			if (v.Page+1)*v.Size <= a.pager.Rules().Limit {
				v.NextURL = link(url.Values{cursor.ParamPage: {strconv.Itoa(v.Page + 1)}})
			} else {
				v.OlderURL = link(url.Values{cursor.ParamAfter: {*resp.Next}})
			}
		}
	} else if resp.Next != nil {
		v.OlderURL = link(url.Values{cursor.ParamAfter: {*resp.Next}})
	}
	renderPage(w, http.StatusOK, v)
}

func renderPage(w http.ResponseWriter, status int, v auditView) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'")
	w.Header().Set("X-Frame-Options", "DENY")
	w.WriteHeader(status)
	_ = auditPage.Execute(w, v)
}

// handleAuditSignIn is POST /audit: it takes an API token from the page's
// form, checks it, and keeps it in the page's cookie.
func (a *App) handleAuditSignIn(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, 4096)
	token := strings.TrimSpace(r.PostFormValue("token"))
	if token == "" || len(token) > 256 {
		renderPage(w, http.StatusUnauthorized, auditView{SignIn: true, Error: "Enter an API token."})
		return
	}
	ctx, cancel := dbContext(r.Context())
	defer cancel()
	if _, err := a.q.ApiTokenLookup(ctx, a.primary, TokenDigest(token)); err != nil {
		if !errors.Is(err, pgx.ErrNoRows) {
			// The token could not be checked: not "unknown", and not signed in.
			a.log.WarnContext(r.Context(), "audit page sign-in: token not checked", "err", err)
			renderPage(w, http.StatusServiceUnavailable, auditView{SignIn: true, Error: "The database cannot be reached; try again shortly."})
			return
		}
		renderPage(w, http.StatusUnauthorized, auditView{SignIn: true, Error: "That API token is unknown."})
		return
	}
	http.SetCookie(w, &http.Cookie{Name: tokenCookie, Value: token, Path: "/audit", HttpOnly: true, SameSite: http.SameSiteStrictMode, MaxAge: 8 * 3600})
	http.Redirect(w, r, "/audit", http.StatusSeeOther)
}

// pageToken lets the page's cookie stand in for the Authorization header;
// without either it shows the sign-in form.
func (a *App) pageToken(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "" {
			c, err := r.Cookie(tokenCookie)
			if err != nil || c.Value == "" {
				renderPage(w, http.StatusOK, auditView{SignIn: true})
				return
			}
			r = r.Clone(r.Context())
			r.Header.Set("Authorization", "Bearer "+c.Value)
		}
		next.ServeHTTP(w, r)
	})
}
