package main

import (
	"fmt"
	"strings"

	"github.com/pglimit/pglimit/internal/bench"
)

// target is one cost the project set itself (issues 13 and 14), judged
// from this run's own figures.
type target struct {
	what string
	// measure returns the figure and whether both of its results are in
	// the run.
	measure func(r *Report) (float64, bool)
	// most: the figure must be at most limit; otherwise at least.
	most  bool
	limit float64
}

// p50Over is path's p50 over base's, at clients.
func p50Over(path, base string, clients int) func(r *Report) (float64, bool) {
	return func(r *Report) (float64, bool) {
		a, ok1 := r.find(path, clients)
		b, ok2 := r.find(base, clients)
		if !ok1 || !ok2 || b.P50 <= 0 {
			return 0, false
		}
		return float64(a.P50) / float64(b.P50), true
	}
}

// opsOver is path's throughput at clients over base's at baseClients.
func opsOver(path string, clients int, base string, baseClients int) func(r *Report) (float64, bool) {
	return func(r *Report) (float64, bool) {
		a, ok1 := r.find(path, clients)
		b, ok2 := r.find(base, baseClients)
		if !ok1 || !ok2 || b.Throughput() <= 0 {
			return 0, false
		}
		return a.Throughput() / b.Throughput(), true
	}
}

var targets = []target{
	{"heavy claim+release p50 ÷ SELECT 1, 1 client", p50Over("heavy claim+release", bench.NameSelect1, 1), true, 4},
	{"in-flight claim+release p50 ÷ SELECT 1, 1 client", p50Over("in-flight claim+release", bench.NameSelect1, 1), true, 3},
	{"upload claim p50 ÷ SELECT 1, 1 client", p50Over("upload claim", bench.NameSelect1, 1), true, 2.5},
	{"failed sign-in p50 ÷ redis_rate Allow, 1 client", p50Over("failure record", bench.NameRedisRate, 1), true, 1.3},
	{"in-flight claim+release ops/s ÷ SELECT 1's, 16 clients", opsOver("in-flight claim+release", 16, bench.NameSelect1, 16), false, 0.5},
	{"heavy claim+release ops/s at 16 clients ÷ at 1 client", opsOver("heavy claim+release", 16, "heavy claim+release", 1), false, 1.5},
	{"rate limit decision p50 ÷ redis_rate Allow, 1 client", p50Over(bench.NameRateLimit, bench.NameRedisRate, 1), true, 1.3},
	{"rate limit decision ops/s ÷ redis_rate's, 16 clients", opsOver(bench.NameRateLimit, 16, bench.NameRedisRate, 16), false, 0.6},
}

// targets writes each target beside this run's figure.
func (r *Report) targets(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Targets\n\n")
	w("The costs the project set itself (issues 13 and 14), judged from this run's own figures (the decision paths above, not the rate rounds below).\n\n")
	w("| target | wanted | this run | met |\n|---|---:|---:|---|\n")
	for _, t := range targets {
		x, ok := t.measure(r)
		want := "≥ " + formatRatio(t.limit)
		if t.most {
			want = "≤ " + formatRatio(t.limit)
		}
		if !ok {
			w("| %s | %s | – | not measured |\n", t.what, want)
			continue
		}
		met := "yes"
		if t.most && x > t.limit || !t.most && x < t.limit {
			met = "**no**"
		}
		w("| %s | %s | %s | %s |\n", t.what, want, formatRatio(x), met)
	}
}

// requestSection writes the whole-request paths beside the handler alone.
func (r *Report) requestSection(b *strings.Builder) {
	var paths []bench.Path
	for _, p := range r.Paths {
		if p.Kind == bench.Request {
			paths = append(paths, p)
		}
	}
	if len(paths) == 0 {
		return
	}
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## The whole request\n\n")
	w("What a user's request pays end to end: a GET from a keep-alive client through an httptest server and the middleware chain to a handler writing 3 bytes, with a real pool, beside the same handler alone.\n\n")
	w("| chain | clients | p50 | p99 | ops/s | added to the handler alone (p50) | ÷ handler alone p50 |\n|---|---:|---:|---:|---:|---:|---:|\n")
	for _, clients := range r.Options.clients {
		alone, ok := r.find(bench.NameRequestAlone, clients)
		for _, p := range paths {
			m, found := r.find(p.Name, clients)
			if !found {
				continue
			}
			added, ratio := "–", "–"
			if ok && alone.P50 > 0 {
				added = formatDur(m.P50 - alone.P50)
				ratio = formatRatio(float64(m.P50) / float64(alone.P50))
			}
			w("| %s | %d | %s | %s | %s | %s | %s |\n", strings.TrimPrefix(p.Name, "request: "), clients,
				formatDur(m.P50), formatDur(m.P99), formatOps(m.Throughput()), added, ratio)
		}
	}
	w("\n")
	for _, p := range paths {
		w("- **%s** — %s\n", strings.TrimPrefix(p.Name, "request: "), p.What)
	}
}
