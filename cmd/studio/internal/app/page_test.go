package app

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"

	studioschema "github.com/pglimit/pglimit/cmd/studio/sql/schema"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// testApp is a replica of the service, in this process, on a database of
// the test's own with the demo data; it is closed when the test ends.
func testApp(t *testing.T, args ...string) (*App, string) {
	t.Helper()
	url := pgtest.URL(t, pgtest.Migration{FS: studioschema.FS(), Table: studioschema.VersionTable, LockID: studioschema.LockID})
	cfg, err := ParseFlags(append([]string{"-database-url", url, "-demo", "-replica-name", t.Name()}, args...))
	if err != nil {
		t.Fatal(err)
	}
	a, err := New(context.Background(), cfg, false, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	return a, url
}

// TestPageSignInForms: the pages' sign-in forms (POST /audit, POST
// /limits) refuse a post a browser marks as cross-origin (Sec-Fetch-Site
// cross-site, or an Origin of another host): 403 problem+json
// cross-origin-request, and no cookie is set. A same-origin post (and one
// without either header, as curl sends) signs in: 303 to the page with the
// token's cookie, HttpOnly and SameSite=Strict, and Secure exactly when the
// page was served over TLS.
func TestPageSignInForms(t *testing.T) {
	t.Parallel()
	a, _ := testApp(t)
	plain := httptest.NewServer(a.Handler())
	defer plain.Close()
	tls := httptest.NewTLSServer(a.Handler())
	defer tls.Close()

	post := func(srv *httptest.Server, path string, header map[string]string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(url.Values{"token": {"alice-token"}}.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		for k, v := range header {
			req.Header.Set(k, v)
		}
		c := srv.Client()
		c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	for _, path := range []string{"/audit", "/limits"} {
		for _, srv := range []*httptest.Server{plain, tls} {
			for _, cross := range []map[string]string{
				{"Sec-Fetch-Site": "cross-site"},
				{"Sec-Fetch-Site": "same-site"},
				{"Origin": "https://evil.example"},
			} {
				resp := post(srv, path, cross)
				if resp.StatusCode != http.StatusForbidden || resp.Header.Get("Content-Type") != "application/problem+json" {
					t.Errorf("POST %s %v: %d %q, want 403 problem+json", path, cross, resp.StatusCode, resp.Header.Get("Content-Type"))
				}
				if len(resp.Cookies()) != 0 {
					t.Errorf("POST %s %v: a refused post set a cookie: %v", path, cross, resp.Cookies())
				}
			}
			// A proxy's X-Forwarded-Proto is not believed: the cookie is
			// Secure exactly when this server served the page over TLS.
			for _, same := range []map[string]string{{"Sec-Fetch-Site": "same-origin"}, {"Origin": srv.URL}, nil, {"X-Forwarded-Proto": "https"}} {
				resp := post(srv, path, same)
				if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != path {
					t.Errorf("POST %s %v: %d %q, want 303 to the page", path, same, resp.StatusCode, resp.Header.Get("Location"))
					continue
				}
				cs := resp.Cookies()
				if len(cs) != 1 || cs[0].Name != tokenCookie || cs[0].Value != "alice-token" || !cs[0].HttpOnly ||
					cs[0].SameSite != http.SameSiteStrictMode || cs[0].Path != path {
					t.Errorf("POST %s %v: cookies %v", path, same, cs)
					continue
				}
				if tlsServed := srv == tls; cs[0].Secure != tlsServed {
					t.Errorf("POST %s over TLS %v: cookie Secure %v", path, tlsServed, cs[0].Secure)
				}
			}
		}
	}
}
