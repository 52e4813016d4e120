package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Chart draws the churn as SVG: the total size of each limit table over time (with a
// tick where autovacuum had run on it since the sample before) and the
// latency of the heavy and in-flight claims. Plain SVG written here: no
// plotting module is needed to read or regenerate it.
func (r *Report) Chart() string {
	load := r.Churn.Load()
	const (
		width, left, right = 960.0, 70.0, 190.0
		panelH, top, gap   = 230.0, 40.0, 70.0
	)
	plotW := width - left - right
	height := top + 2*panelH + gap + 50
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	b.WriteString(`<rect width="100%" height="100%" fill="white"/>` + "\n")
	if len(load) == 0 {
		b.WriteString("</svg>\n")
		return b.String()
	}
	end := load[len(load)-1].At.Seconds()
	x := func(at time.Duration) float64 { return left + plotW*at.Seconds()/end }
	colors := []string{"#3b6fb6", "#e07b39", "#5a9e4b", "#9b59b6", "#c0392b", "#7f8c8d", "#16a085"}

	// Panel 1: sizes.
	var maxKB float64
	for _, s := range load {
		for _, t := range s.Tables {
			maxKB = math.Max(maxKB, float64(t.TotalBytes)/1024)
		}
	}
	maxKB = niceCeil(maxKB)
	y1 := func(kb float64) float64 { return top + panelH - panelH*kb/maxKB }
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">Limit tables under churn: pg_total_relation_size (kB); a tick marks autovacuum runs</text>`+"\n", left, top-16)
	axes(&b, left, top, plotW, panelH, maxKB, end)
	for i, name := range limitTables {
		c := colors[i%len(colors)]
		var pts []string
		prevAV := int64(0)
		for _, s := range load {
			t, _ := s.Table(name)
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.At), y1(float64(t.TotalBytes)/1024)))
			if t.Autovacuums > prevAV {
				fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="%s" stroke-width="2"/>`+"\n",
					x(s.At), x(s.At), y1(float64(t.TotalBytes)/1024)-6, y1(float64(t.TotalBytes)/1024)+6, c)
			}
			prevAV = t.Autovacuums
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="12" height="3" fill="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			left+plotW+15, top+10+float64(i)*18, c, left+plotW+32, top+14+float64(i)*18, name)
	}

	// Panel 2: claim latency, on a logarithmic axis of whole decades.
	top2 := top + panelH + gap
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range load {
		for _, d := range []time.Duration{s.HeavyP50, s.HeavyP99, s.InflightP50, s.InflightP99} {
			if d > 0 {
				lo, hi = math.Min(lo, math.Log10(ms(d))), math.Max(hi, math.Log10(ms(d)))
			}
		}
	}
	if math.IsInf(lo, 0) {
		lo, hi = -1, 1
	}
	lo, hi = math.Floor(lo), math.Max(math.Ceil(hi), math.Floor(lo)+1)
	y2 := func(v float64) float64 {
		if v <= 0 {
			return top2 + panelH
		}
		return top2 + panelH - panelH*(math.Log10(v)-lo)/(hi-lo)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" font-size="14" font-weight="bold">Claim latency (Acquire) per sample interval, ms, log scale</text>`+"\n", left, top2-16)
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, top2, plotW, panelH)
	for d := lo; d <= hi; d++ {
		yy := y2(math.Pow(10, d))
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, left+plotW, yy, yy, left-6, yy+4, trimFloat(math.Pow(10, d)))
	}
	xTicks(&b, left, top2, plotW, panelH, end)
	series := []struct {
		name  string
		value func(Sample) time.Duration
		color string
		dash  string
	}{
		{"heavy p50", func(s Sample) time.Duration { return s.HeavyP50 }, colors[0], ""},
		{"heavy p99", func(s Sample) time.Duration { return s.HeavyP99 }, colors[0], "5,3"},
		{"in-flight p50", func(s Sample) time.Duration { return s.InflightP50 }, colors[1], ""},
		{"in-flight p99", func(s Sample) time.Duration { return s.InflightP99 }, colors[1], "5,3"},
	}
	for i, sr := range series {
		var pts []string
		for _, s := range load {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", x(s.At), y2(ms(sr.value(s)))))
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.8" stroke-dasharray="%s" points="%s"/>`+"\n", sr.color, sr.dash, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2" stroke-dasharray="%s"/><text x="%.0f" y="%.0f">%s</text>`+"\n",
			left+plotW+15, left+plotW+29, top2+12+float64(i)*18, top2+12+float64(i)*18, sr.color, sr.dash, left+plotW+34, top2+16+float64(i)*18, sr.name)
	}
	fmt.Fprintf(&b, `<text x="%.0f" y="%.0f" text-anchor="middle">time since the churn started (s)</text>`+"\n", left+plotW/2, height-12)
	b.WriteString("</svg>\n")
	return b.String()
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// axes draws a panel's frame, its y grid (four steps to top) and its x
// ticks in seconds.
func axes(b *strings.Builder, left, top, w, h, maxY, end float64) {
	fmt.Fprintf(b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#999"/>`+"\n", left, top, w, h)
	for i := 0; i <= 4; i++ {
		v := maxY * float64(i) / 4
		y := top + h - h*float64(i)/4
		fmt.Fprintf(b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#e5e5e5"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`+"\n",
			left, left+w, y, y, left-6, y+4, trimFloat(v))
	}
	xTicks(b, left, top, w, h, end)
}

// xTicks draws a panel's time axis in seconds.
func xTicks(b *strings.Builder, left, top, w, h, end float64) {
	step := niceCeil(end / 8)
	for s := 0.0; s <= end+1e-9; s += step {
		xx := left + w*s/end
		fmt.Fprintf(b, `<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#999"/><text x="%.1f" y="%.0f" text-anchor="middle">%s</text>`+"\n",
			xx, xx, top+h, top+h+4, xx, top+h+17, trimFloat(s))
	}
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*p {
			return m * p
		}
	}
	return 10 * p
}

func trimFloat(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
