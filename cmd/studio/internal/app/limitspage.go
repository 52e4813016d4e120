package app

import (
	_ "embed"
	"fmt"
	"html"
	"html/template"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

//go:embed limits.html
var limitsHTML string

//go:embed limits.js
var limitsJS []byte

var limitsPage = template.Must(template.New("limits").Funcs(template.FuncMap{
	"clock": func(t time.Time) string { return t.UTC().Format("15:04:05") },
}).Parse(limitsHTML))

// limitsCSP lets the page run its one script (from this origin) and fetch
// its live part; nothing else.
const limitsCSP = "default-src 'none'; style-src 'unsafe-inline'; script-src 'self'; connect-src 'self'; form-action 'self'"

// limitsView is the operator page: its sign-in form, or its live part.
type limitsView struct {
	SignIn bool
	Error  string
	Live   *liveView
}

// liveView is what the page shows of the limits now; GET /limits/live
// serves it alone, for the page to refresh itself without a reload.
type liveView struct {
	Replica         string
	Now, From, To   time.Time
	Refusals        []refusalView
	Heavy           []heavyView
	HeavyRequests   int
	InstallationCap int
	InFlight        []limitRow
	InFlightCap     int
	Uploads         []uploadView
	UploadLimit     int
	UploadWindow    string
	Throttles       []throttleRow
	Bans            []banRow
	Overrides       []overrideJSON
	SignInLimit     int
	// SignInAddressLimit is -sign-in-address-failures (0: off).
	SignInAddressLimit int
	SignInWindow       string
	Replicas           []replicaRow
	ReadyReplicas      int
	ReadReplica        string
	// More* are the rows each bounded list (listMax) left out.
	MorePermits, MoreInFlight, MoreUploads, MoreThrottles, MoreBans int64
}

type refusalView struct {
	Name            string
	Refused, DryRun int64
	InDryRun        bool
	Chart           template.HTML
}

type heavyView struct {
	Endpoint, Scope, Holder, Replica string
	ClaimedAt, ExpiresAt             time.Time
}

type uploadView struct {
	User      string
	Count     int
	NextLapse time.Time
}

func limitsSignInForm(w http.ResponseWriter) {
	renderLimits(w, http.StatusOK, limitsView{SignIn: true})
}

func auditSignInForm(w http.ResponseWriter) {
	renderPage(w, http.StatusOK, auditView{SignIn: true})
}

func renderLimits(w http.ResponseWriter, status int, v limitsView) {
	writeHTML(w, status, limitsCSP, func(w io.Writer) error { return limitsPage.ExecuteTemplate(w, "page", v) })
}

// handleLimitsSignIn is POST /limits: an operator's token from the page's
// form, kept in the page's cookie.
func (a *App) handleLimitsSignIn(w http.ResponseWriter, r *http.Request) {
	a.pageSignIn(w, r, "/limits", true, func(status int, msg string) {
		renderLimits(w, status, limitsView{SignIn: true, Error: msg})
	})
}

// handleLimitsPage is GET /limits, the operator page: what every limit
// holds now and how often each refused in the last 15 minutes, across
// all replicas. It refreshes its live part every few seconds
// (limits.js, GET /limits/live).
func (a *App) handleLimitsPage(w http.ResponseWriter, r *http.Request) {
	live, ok := a.live(w, r)
	if !ok {
		return
	}
	renderLimits(w, http.StatusOK, limitsView{Live: live})
}

// handleLimitsLive is GET /limits/live: the live part of the page alone.
func (a *App) handleLimitsLive(w http.ResponseWriter, r *http.Request) {
	live, ok := a.live(w, r)
	if !ok {
		return
	}
	writeHTML(w, http.StatusOK, limitsCSP, func(w io.Writer) error { return limitsPage.ExecuteTemplate(w, "live", live) })
}

func handleLimitsScript(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/javascript; charset=utf-8")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	_, _ = w.Write(limitsJS)
}

// live reads the limits (readLimits) and shapes them for the page; a
// failure is answered as the API's.
func (a *App) live(w http.ResponseWriter, r *http.Request) (*liveView, bool) {
	ctx, cancel := listingContext(r.Context())
	defer cancel()
	l, err := a.readLimits(ctx)
	if err != nil {
		a.dbError(w, r, err)
		return nil, false
	}
	v := &liveView{
		Replica: l.Replica, Now: time.Now(), Throttles: l.Throttles, Replicas: l.Replicas, ReadyReplicas: l.ReadyReplicas,
		InstallationCap: l.InstallationCap, InFlight: l.InFlight, InFlightCap: a.cfg.TokenInFlight,
		UploadLimit: a.cfg.UploadsPerHour, UploadWindow: formatWindow(a.cfg.UploadWindow),
		SignInLimit: a.cfg.SignInFailures, SignInAddressLimit: a.cfg.SignInAddressFailures, SignInWindow: formatWindow(a.cfg.SignInWindow),
		MorePermits:   l.Totals.Permits - int64(len(l.Permits)),
		MoreInFlight:  l.Totals.InFlight - int64(len(l.InFlight)),
		MoreUploads:   l.Totals.UploadWindows - int64(len(l.UploadWindows)),
		MoreThrottles: l.Totals.Throttles - int64(len(l.Throttles)),
		Bans:          l.Bans,
		Overrides:     l.Overrides,
		MoreBans:      l.Totals.Bans - int64(len(l.Bans)),
	}
	if l.ReadReplica != nil {
		v.ReadReplica = map[bool]string{true: "answers; history reads go to it", false: "does not answer; history reads go to the primary"}[*l.ReadReplica]
	}
	if n := len(l.Refusals.Minutes); n > 0 {
		v.From, v.To = l.Refusals.Minutes[0], l.Refusals.Minutes[n-1].Add(time.Minute)
	}
	// Every limit of the service, refused or not, then any other limit
	// counted in the same database.
	names := slices.Clone(LimitNames)
	for _, lr := range l.Refusals.Limits {
		if !slices.Contains(names, lr.Name) {
			names = append(names, lr.Name)
		}
	}
	for _, name := range names {
		rv := refusalView{Name: name, InDryRun: a.cfg.DryRun[name]}
		refused, dry := make([]int64, len(l.Refusals.Minutes)), make([]int64, len(l.Refusals.Minutes))
		for _, lr := range l.Refusals.Limits {
			if lr.Name == name {
				refused, dry = lr.Refused, lr.DryRunRefused
			}
		}
		for i := range refused {
			rv.Refused += refused[i]
			rv.DryRun += dry[i]
		}
		rv.Chart = refusalChart(name, l.Refusals.Minutes, refused, dry)
		v.Refusals = append(v.Refusals, rv)
	}
	for _, p := range l.Permits {
		scope := "user"
		if p.Scope == "installation" {
			scope = "installation"
			v.HeavyRequests++
		}
		v.Heavy = append(v.Heavy, heavyView{Endpoint: p.Endpoint, Scope: scope, Holder: p.Holder, Replica: p.Replica,
			ClaimedAt: p.ClaimedAt, ExpiresAt: p.ExpiresAt})
	}
	slices.SortStableFunc(v.Heavy, func(x, y heavyView) int {
		return strings.Compare(x.Endpoint+" "+x.Scope+" "+x.Holder, y.Endpoint+" "+y.Scope+" "+y.Holder)
	})
	for _, u := range l.UploadWindows {
		i := slices.IndexFunc(v.Uploads, func(x uploadView) bool { return x.User == u.Holder })
		if i < 0 {
			v.Uploads = append(v.Uploads, uploadView{User: u.Holder, NextLapse: u.ExpiresAt})
			i = len(v.Uploads) - 1
		}
		v.Uploads[i].Count++
		if u.ExpiresAt.Before(v.Uploads[i].NextLapse) {
			v.Uploads[i].NextLapse = u.ExpiresAt
		}
	}
	return v, true
}

// Chart geometry: one bar a minute.
const (
	chartBar    = 8
	chartGap    = 2
	chartHeight = 28
)

// refusalChart draws a limit's refusals per minute as a small bar chart,
// refusals at the bottom of each bar and dry-run refusals above them, on
// the limit's own scale (its highest minute fills the height, which the
// chart's title says). Each bar's title gives its minute and counts.
func refusalChart(name string, minutes []time.Time, refused, dry []int64) template.HTML {
	var peak int64 = 1
	for i := range refused {
		peak = max(peak, refused[i]+dry[i])
	}
	width := len(minutes)*(chartBar+chartGap) - chartGap
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" role="img" aria-label="%s: refusals per minute, highest %d">`,
		width, chartHeight+1, width, chartHeight+1, html.EscapeString(name), peak)
	fmt.Fprintf(&b, `<line x1="0" y1="%d" x2="%d" y2="%d" stroke="#bbb"/>`, chartHeight, width, chartHeight)
	for i, m := range minutes {
		x := i * (chartBar + chartGap)
		hr := int(refused[i] * chartHeight / peak)
		hd := int((refused[i]+dry[i])*chartHeight/peak) - hr
		if refused[i] > 0 && hr == 0 {
			hr = 1 // a minute with a refusal never looks empty
		}
		if dry[i] > 0 && hd == 0 {
			hd = 1
		}
		fmt.Fprintf(&b, `<g><title>%s UTC: %d refused, %d in dry run</title>`, m.UTC().Format("15:04"), refused[i], dry[i])
		fmt.Fprintf(&b, `<rect x="%d" y="0" width="%d" height="%d" fill="transparent"/>`, x, chartBar, chartHeight)
		if hr > 0 {
			fmt.Fprintf(&b, `<rect class="bar-refused" x="%d" y="%d" width="%d" height="%d" fill="#c0392b"/>`, x, chartHeight-hr, chartBar, hr)
		}
		if hd > 0 {
			fmt.Fprintf(&b, `<rect class="bar-dry" x="%d" y="%d" width="%d" height="%d" fill="#e69f00"/>`, x, chartHeight-hr-hd, chartBar, hd)
		}
		b.WriteString(`</g>`)
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String()) // built from numbers, times and the escaped name only
}

// formatWindow names a window as the page does: "hour", "2 hours",
// "15 minutes", "2 seconds", or as Go writes a duration ("1.5s").
func formatWindow(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{time.Hour, "hour"}, {time.Minute, "minute"}, {time.Second, "second"}} {
		if d >= u.d && d%u.d == 0 {
			if n := d / u.d; n > 1 {
				return fmt.Sprintf("%d %ss", n, u.name)
			}
			return u.name
		}
	}
	return d.String()
}
