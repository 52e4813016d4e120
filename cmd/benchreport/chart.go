package main

import (
	"fmt"
	"html"
	"math"
	"strings"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/bench"
)

// SVG draws every path's p50 (bar) and p99 (whisker) at each client count
// on a logarithmic axis, baselines first. It is plain SVG written here: no
// plotting module is needed to read or regenerate it.
func (r *Report) SVG() string {
	clients := r.Options.clients
	colors := []string{"#3b6fb6", "#e07b39", "#5a9e4b", "#9b59b6"}
	const (
		left, right, top, rowGap = 230.0, 30.0, 70.0, 6.0
		barH                     = 9.0
		width                    = 960.0
	)
	var names []string
	kinds := map[string]bench.Kind{}
	for _, p := range r.Paths {
		names = append(names, p.Name)
		kinds[p.Name] = p.Kind
	}
	rowH := barH*float64(len(clients)) + rowGap + 4
	height := top + rowH*float64(len(names)) + 50
	// The axis spans whole decades around every figure.
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, m := range r.Results {
		for _, d := range []time.Duration{m.Result.P50, m.Result.P99} {
			if d > 0 {
				lo = math.Min(lo, math.Log10(float64(d)))
				hi = math.Max(hi, math.Log10(float64(d)))
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = 3, 9
	}
	lo, hi = math.Floor(lo), math.Ceil(hi)
	if hi <= lo {
		hi = lo + 1
	}
	x := func(d time.Duration) float64 {
		if d <= 0 {
			return left
		}
		return left + (math.Log10(float64(d))-lo)/(hi-lo)*(width-left-right)
	}

	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format, args...) }
	w(`<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	w(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	w(`<text x="%.0f" y="20" font-size="14" font-weight="bold">pglimit paths beside their baselines: p50 (bar) and p99 (whisker), log scale</text>`+"\n", left-220)
	w(`<text x="%.0f" y="38" fill="#555">%s</text>`+"\n", left-220, html.EscapeString(r.Machine))
	for i, c := range clients {
		lx := left + float64(i)*110
		w(`<rect x="%.0f" y="48" width="12" height="9" fill="%s"/><text x="%.0f" y="56">%d client%s</text>`+"\n", lx, colors[i%len(colors)], lx+16, c, plural(c))
	}
	// Decade grid.
	for e := lo; e <= hi; e++ {
		gx := x(time.Duration(math.Pow(10, e)))
		w(`<line x1="%.1f" y1="%.0f" x2="%.1f" y2="%.0f" stroke="#ddd"/>`+"\n", gx, top-6, gx, height-40)
		w(`<text x="%.1f" y="%.0f" text-anchor="middle" fill="#555">%s</text>`+"\n", gx, height-26, decade(int(e)))
	}
	y := top
	prevKind := bench.Kind("")
	for _, name := range names {
		if kinds[name] != prevKind && prevKind != "" {
			w(`<line x1="10" y1="%.1f" x2="%.0f" y2="%.1f" stroke="#999" stroke-dasharray="3,3"/>`+"\n", y-rowGap/2, width-right, y-rowGap/2)
		}
		prevKind = kinds[name]
		label := html.EscapeString(name)
		if kinds[name] == bench.Baseline {
			label = `<tspan font-style="italic">` + label + `</tspan>`
		}
		w(`<text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n", left-8, y+barH*float64(len(clients))/2+4, label)
		for i, c := range clients {
			res, ok := r.find(name, c)
			if !ok {
				continue
			}
			by := y + float64(i)*barH
			col := colors[i%len(colors)]
			w(`<rect x="%.0f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s, %d client%s: p50 %s, p99 %s, %s ops/s</title></rect>`+"\n",
				left, by, math.Max(x(res.P50)-left, 1), barH-1, col, html.EscapeString(name), c, plural(c),
				formatDur(res.P50), formatDur(res.P99), formatOps(res.Throughput()))
			if res.P99 > res.P50 {
				w(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/><line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="%s"/>`+"\n",
					x(res.P50), by+barH/2-0.5, x(res.P99), by+barH/2-0.5, col, x(res.P99), by+1, x(res.P99), by+barH-2, col)
			}
		}
		y += rowH
	}
	w(`<text x="%.0f" y="%.0f" fill="#555">latency per operation (log scale); baselines in italics</text>`+"\n", left, height-8)
	w("</svg>\n")
	return b.String()
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// decade names 10^e nanoseconds: "10 ns", "1 µs", "100 ms", "10 s".
func decade(e int) string {
	units := []string{"ns", "µs", "ms", "s"}
	u := min(max(e/3, 0), len(units)-1)
	return fmt.Sprintf("%.0f %s", math.Pow(10, float64(e-3*u)), units[u])
}
