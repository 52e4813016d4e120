package main

import (
	_ "embed"
	"fmt"
	"io"
	"math"
	"path/filepath"
	"strconv"
	"strings"
	"text/template"
	"time"
)

//go:embed scaling.md.tmpl
var reportTemplate string

// TableSummary is one limit table over the churn.
type TableSummary struct {
	Name string
	// First, Max and Last are the total size at the first sample, the
	// largest over the load and at the last sample under load; Final after
	// the windows lapsed and a sweep.
	First, Max, Last, Final int64
	// FirstHalfMax and SecondHalfMax are the largest total size in each
	// half of the load's samples.
	FirstHalfMax, SecondHalfMax int64
	// MaxRows, MaxLive and MaxDead are the most rows (count(*)), rows that
	// had not lapsed, and dead rows (n_dead_tup) seen; FinalRows after the
	// sweep.
	MaxRows, MaxLive, MaxDead, FinalRows int64
	// Autovacuums and Autoanalyzes are autovacuum's runs during the churn.
	Autovacuums, Autoanalyzes int64
	// MaxIndex and LastIndex are the indexes' size.
	MaxIndex, LastIndex int64
}

// Plateaued reports whether the table stopped growing: its largest size in
// the second half of the load is within a tenth (or 64 kB) of the first
// half's.
func (t TableSummary) Plateaued() bool {
	grow := t.SecondHalfMax - t.FirstHalfMax
	return grow <= 64<<10 || float64(grow) <= 0.1*float64(t.FirstHalfMax)
}

// Summaries sums the churn up per table.
func (c *Churn) Summaries() []TableSummary {
	var load []Sample
	var final *Sample
	for i := range c.Samples {
		if c.Samples[i].Final {
			final = &c.Samples[i]
		} else {
			load = append(load, c.Samples[i])
		}
	}
	var out []TableSummary
	for _, name := range limitTables {
		s := TableSummary{Name: name}
		for i, smp := range load {
			t, _ := smp.Table(name)
			if i == 0 {
				s.First = t.TotalBytes
			}
			s.Max = max(s.Max, t.TotalBytes)
			s.MaxIndex = max(s.MaxIndex, t.IndexBytes)
			if i < (len(load)+1)/2 {
				s.FirstHalfMax = max(s.FirstHalfMax, t.TotalBytes)
			} else {
				s.SecondHalfMax = max(s.SecondHalfMax, t.TotalBytes)
			}
			s.MaxRows, s.MaxLive, s.MaxDead = max(s.MaxRows, t.Rows), max(s.MaxLive, t.Live), max(s.MaxDead, t.NDead)
			s.Last, s.LastIndex = t.TotalBytes, t.IndexBytes
			s.Autovacuums, s.Autoanalyzes = t.Autovacuums, t.Autoanalyzes
		}
		if final != nil {
			t, _ := final.Table(name)
			s.Final, s.FinalRows = t.TotalBytes, t.Rows
			s.Autovacuums, s.Autoanalyzes = t.Autovacuums, t.Autoanalyzes
		}
		out = append(out, s)
	}
	return out
}

// MaxHeavyP99 is the highest p99 of the heavy claims over the samples
// under load, and MedianHeavyP50 the median of their p50s.
func (c *Churn) MaxHeavyP99() time.Duration {
	var m time.Duration
	for _, s := range c.Samples {
		m = max(m, s.HeavyP99)
	}
	return m
}

// HeavyP50Range is the lowest and highest p50 of the heavy claims over the
// samples under load.
func (c *Churn) HeavyP50Range() (lo, hi time.Duration) {
	for _, s := range c.Samples {
		if s.Final || s.Ops == 0 {
			continue
		}
		if lo == 0 || s.HeavyP50 < lo {
			lo = s.HeavyP50
		}
		hi = max(hi, s.HeavyP50)
	}
	return lo, hi
}

// Load returns the samples under load.
func (c *Churn) Load() []Sample {
	var out []Sample
	for _, s := range c.Samples {
		if !s.Final {
			out = append(out, s)
		}
	}
	return out
}

// Final returns the sample after the sweep.
func (c *Churn) Final() Sample {
	for _, s := range c.Samples {
		if s.Final {
			return s
		}
	}
	return Sample{}
}

// AchievedRate is the churn's operations per second.
func (c *Churn) AchievedRate() float64 {
	load := c.Load()
	if len(load) == 0 {
		return 0
	}
	return float64(c.Ops) / load[len(load)-1].At.Seconds()
}

// Markdown writes the report: docs/scaling.md.
func (r *Report) Markdown(w io.Writer) error {
	t, err := template.New("scaling").Funcs(template.FuncMap{
		"dur":   fmtDur,
		"num":   fmtNum,
		"kB":    kB,
		"pct":   func(f float64) string { return fmt.Sprintf("%.0f %%", 100*f) },
		"f2":    func(f float64) string { return fmt.Sprintf("%.2f", f) },
		"op":    func(name string, clients int) OpResult { o, _ := r.Op(name, clients); return o },
		"cap":   func() Capacity { return r.Capacity(DefaultAssumptions) },
		"what":  func(name string) string { return What[name] },
		"secs":  func(d time.Duration) string { return fmt.Sprintf("%.0f s", d.Seconds()) },
		"rate":  func(n int64, d time.Duration) string { return fmtNum(float64(n) / d.Seconds()) },
		"inv":   func(d time.Duration) string { return fmtNum(float64(time.Second) / float64(d)) },
		"mul":   func(a, b float64) float64 { return a * b },
		"div":   func(a, b float64) float64 { return a / b },
		"float": func(n int64) float64 { return float64(n) },
		"yesno": func(b bool) string { return map[bool]string{true: "yes", false: "**no**"}[b] },
		"last":  func() int { return r.Clients[len(r.Clients)-1] },
		"worst": r.Worst,
		"citusOp": func(name string, clients int) OpResult {
			if r.Citus == nil {
				return OpResult{}
			}
			o, _ := r.Citus.Op(name, clients)
			return o
		},
		// perSec is the operations per second one core sustains at d of
		// CPU per operation.
		"perSec": func(d time.Duration) float64 {
			if d <= 0 {
				return 0
			}
			return float64(time.Second) / float64(d)
		},
		"minf": math.Min,
		// ratio is an operation's CPU on Citus over its CPU on one server.
		"ratio": func(c *CitusRun, name string, clients int) string {
			one, _ := r.Op(name, clients)
			on, _ := c.Op(name, clients)
			if one.ServerPerOp() <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", float64(on.ServerPerOp())/float64(one.ServerPerOp()))
		},
		// ratioWorkers is an operation's CPU on Citus, sent to the
		// workers, over its CPU on one server.
		"ratioWorkers": func(c *CitusRun, name string, clients int) string {
			one, _ := r.Op(name, clients)
			on, ok := c.OnWorker(name, clients)
			if !ok || one.ServerPerOp() <= 0 {
				return "—"
			}
			return fmt.Sprintf("%.1f", float64(on.ServerPerOp())/float64(one.ServerPerOp()))
		},
		"count": func(n int64) string {
			s := strconv.FormatInt(n, 10)
			for i := len(s) - 3; i > 0; i -= 3 {
				s = s[:i] + "," + s[i:]
			}
			return s
		},
		"busy": r.BusyConnections,
		"clientList": func() string {
			var s []string
			for _, c := range r.Clients {
				s = append(s, strconv.Itoa(c))
			}
			if len(s) == 1 {
				return s[0]
			}
			return strings.Join(s[:len(s)-1], ", ") + " and " + s[len(s)-1]
		},
		"operations": func() []string { return Operations },
		"perOp": func(d time.Duration, n int64) time.Duration {
			if n == 0 {
				return 0
			}
			return d / time.Duration(n)
		},
		"svgName": func() string {
			if r.SVG == "" {
				return ""
			}
			if rel, err := filepath.Rel(filepath.Dir(r.Out), r.SVG); err == nil && r.Out != "" {
				return filepath.ToSlash(rel)
			}
			return filepath.ToSlash(r.SVG)
		},
		"heavyRange": func() string {
			lo, hi := r.Churn.HeavyP50Range()
			return fmtDur(lo) + " and " + fmtDur(hi)
		},
		"cores": func(d time.Duration) string {
			return fmt.Sprintf("%.2f cores", d.Seconds()/r.Sample.Seconds())
		},
		"cell": func(s Sample, name string) string {
			t, _ := s.Table(name)
			return fmt.Sprintf("%d / %s (%d dead)", t.Rows, kB(t.TotalBytes), t.NDead)
		},
		"autovacuums": func(s Sample) int64 {
			var n int64
			for _, t := range s.Tables {
				n += t.Autovacuums
			}
			return n
		},
		"allPlateaued": func() bool {
			for _, t := range r.Churn.Summaries() {
				if !t.Plateaued() {
					return false
				}
			}
			return true
		},
		"totalAutovacuums": func() int64 {
			var n int64
			for _, t := range r.Churn.Summaries() {
				n += t.Autovacuums
			}
			return n
		},
		"walRange": func() string {
			lo, hi := math.Inf(1), 0.0
			for _, o := range r.Ops {
				if o.Name == OpCheck {
					continue // a read writes no WAL
				}
				lo, hi = math.Min(lo, o.WALPerOp()), math.Max(hi, o.WALPerOp())
			}
			return fmt.Sprintf("%.0f to %.0f bytes", lo, hi)
		},
	}).Parse(reportTemplate)
	if err != nil {
		return err
	}
	return t.Execute(w, r)
}

// fmtDur formats a duration with three significant digits.
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "—"
	case d < time.Microsecond:
		return fmt.Sprintf("%d ns", d.Nanoseconds())
	case d < time.Millisecond:
		return fmt.Sprintf("%s µs", sig3(float64(d)/float64(time.Microsecond)))
	case d < time.Second:
		return fmt.Sprintf("%s ms", sig3(float64(d)/float64(time.Millisecond)))
	default:
		return fmt.Sprintf("%s s", sig3(d.Seconds()))
	}
}

func sig3(f float64) string {
	switch {
	case f >= 100:
		return fmt.Sprintf("%.0f", f)
	case f >= 10:
		return fmt.Sprintf("%.1f", f)
	default:
		return fmt.Sprintf("%.2f", f)
	}
}

// fmtNum formats a count with two or three significant digits and a
// thousands separator.
func fmtNum(f float64) string {
	if f <= 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return "—"
	}
	if f < 10 {
		return fmt.Sprintf("%.1f", f)
	}
	mag := math.Pow(10, math.Floor(math.Log10(f))-1)
	if f >= 1000 {
		mag = math.Pow(10, math.Floor(math.Log10(f))-2)
	}
	n := int64(math.Round(f/mag) * mag)
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
