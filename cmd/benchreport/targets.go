package main

import (
	"fmt"
	"strings"
	"time"

	"github.com/pglimit/pglimit/cmd/internal/bench"
)

// floor is what a path cannot do without, measured in the same run: a sum
// of baselines (each with its count), or, for a path that needs no
// statement, an in-process baseline.
type floor struct {
	path  string
	parts []floorPart
	// p50 is the most the path's p50 may be, as a multiple of the floor's
	// p50 (the sum of its parts'), at 1 client; 0: reported, not judged.
	p50 float64
	// ops is the least the path's throughput may be at 16 clients, as a
	// multiple of the floor's (the rate at which its parts run one after
	// another); 0: reported, not judged.
	ops float64
	// abs is the most the path's p50 may be at 1 client, absolutely (0:
	// none), redis the least redis_rate's p50 over it at 1 client (0:
	// none), perSec the least ops/s at 16 clients (0: none).
	abs    time.Duration
	redis  float64
	perSec float64
}

type floorPart struct {
	name string
	n    int
}

func parts(name string, n int, more ...floorPart) []floorPart {
	return append([]floorPart{{name, n}}, more...)
}

// floors are issue 19's: each path judged against the statements it
// cannot do without (a one-row upsert per write, SELECT 1 per read); a
// decision that needs no statement against the in-process baselines and
// redis_rate.
var floors = []floor{
	// Issue 19's goals are in upserts: heavy 3.0, in-flight 2.7 (of a floor
	// of two), upload 1.4 (of one).
	{path: "heavy claim+release", parts: parts(bench.NameUpsert, 2), p50: 3.0 / 2},
	{path: "in-flight claim+release", parts: parts(bench.NameUpsert, 2), p50: 2.7 / 2, ops: 0.8},
	{path: "upload claim", parts: parts(bench.NameUpsert, 1), p50: 1.4},
	{path: "failure record", parts: parts(bench.NameSelect1, 1, floorPart{bench.NameUpsert, 1}), p50: 1.25},
	{path: bench.NameStrictFailure, parts: parts(bench.NameUpsert, 1)},
	{path: bench.NameStrictSuccess, parts: parts(bench.NameUpsert, 2)},
	{path: "sign-in check", parts: parts(bench.NameSelect1, 1)},
	{path: bench.NameRateLimit, parts: parts(bench.NameUpsert, 1)},
	{path: bench.NameRateLimit2, parts: parts(bench.NameUpsert, 1)},
	{path: bench.NameBorrowed, parts: parts(bench.NameSemaphore, 1), abs: 2 * time.Microsecond, redis: 50, perSec: 1e6},
	{path: bench.NameFromMemory, parts: parts(bench.NameSemaphore, 1), abs: time.Microsecond, redis: 50, perSec: 1e6},
	// Issue 29: matching the allow and deny lists at 10,000 entries costs
	// no statement and well under a microsecond.
	{path: bench.NameAccessMatch, parts: parts(bench.NameSemaphore, 1), abs: time.Microsecond, redis: 50, perSec: 1e6},
	// Issue 29: deriving the client address costs no statement.
	{path: bench.NameClientAddr, parts: parts(bench.NameSemaphore, 1), abs: 2 * time.Microsecond, redis: 50, perSec: 1e6},
}

// measure returns the floor's p50 at clients (the sum of its parts') and
// its throughput (its parts run one after another).
func (f floor) measure(r *Report, clients int) (p50 time.Duration, ops float64, ok bool) {
	var perOp float64
	for _, p := range f.parts {
		m, found := r.find(p.name, clients)
		if !found || m.Throughput() <= 0 {
			return 0, 0, false
		}
		p50 += time.Duration(p.n) * m.P50
		perOp += float64(p.n) / m.Throughput()
	}
	return p50, 1 / perOp, true
}

func (f floor) what() string {
	var s []string
	for _, p := range f.parts {
		if p.n == 1 {
			s = append(s, p.name)
		} else {
			s = append(s, fmt.Sprintf("%d × %s", p.n, p.name))
		}
	}
	return strings.Join(s, " + ")
}

// floorsSection writes each path beside its floor, from this run's own
// figures.
func (r *Report) floorsSection(b *strings.Builder) {
	w := func(format string, args ...any) { fmt.Fprintf(b, format, args...) }
	w("\n## Floors\n\n")
	w("Each path beside its floor, measured in the same run: the statements it cannot do without (a one-row upsert per write, SELECT 1 per read), or, for a decision that needs no statement, the in-process semaphore and redis_rate. p50 ÷ floor is at 1 client (the floor's p50 is the sum of its parts'); ops/s ÷ floor is at 16 clients (the floor's rate is its parts run one after another). A goal left blank is reported, not judged.\n\n")
	w("| path | floor | p50, 1 client | ÷ floor | goal | ops/s, 16 clients | ÷ floor | goal | met |\n|---|---|---:|---:|---:|---:|---:|---:|---|\n")
	for _, f := range floors {
		m1, ok1 := r.find(f.path, 1)
		m16, ok16 := r.find(f.path, 16)
		fp50, _, okf1 := f.measure(r, 1)
		_, fops, okf16 := f.measure(r, 16)
		if !ok1 && !ok16 {
			continue
		}
		met := true
		p50, p50Ratio, p50Goal := "–", "–", ""
		if ok1 {
			p50 = formatDur(m1.P50)
			if okf1 && fp50 > 0 {
				x := float64(m1.P50) / float64(fp50)
				p50Ratio = formatRatio(x)
				if f.p50 > 0 {
					p50Goal = "≤ " + formatRatio(f.p50)
					met = met && x <= f.p50
				}
			}
			if f.abs > 0 {
				p50Goal = join(p50Goal, "≤ "+formatDur(f.abs))
				met = met && m1.P50 <= f.abs
			}
			if f.redis > 0 {
				if rr, ok := r.find(bench.NameRedisRate, 1); ok && m1.P50 > 0 {
					x := float64(rr.P50) / float64(m1.P50)
					p50Goal = join(p50Goal, fmt.Sprintf("redis_rate ÷ it ≥ %.0f× (%s)", f.redis, formatRatio(x)))
					met = met && x >= f.redis
				}
			}
		}
		ops, opsRatio, opsGoal := "–", "–", ""
		if ok16 {
			ops = formatOps(m16.Throughput())
			if okf16 && fops > 0 {
				x := m16.Throughput() / fops
				opsRatio = formatRatio(x)
				if f.ops > 0 {
					opsGoal = "≥ " + formatRatio(f.ops)
					met = met && x >= f.ops
				}
			}
			if f.perSec > 0 {
				opsGoal = join(opsGoal, "≥ "+formatOps(f.perSec)+"/s")
				met = met && m16.Throughput() >= f.perSec
			}
		}
		verdict := "–"
		if p50Goal != "" || opsGoal != "" {
			verdict = "yes"
			if !met {
				verdict = "**no**"
			}
		}
		w("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", f.path, f.what(), p50, p50Ratio, p50Goal, ops, opsRatio, opsGoal, verdict)
	}
	// The whole request: the rate limit borrowing adds at most 1.1× what
	// the in-flight cap alone adds.
	for _, clients := range []int{1, 16} {
		alone, ok1 := r.find(bench.NameRequestAlone, clients)
		fl, ok2 := r.find(bench.NameRequestInflight, clients)
		api, ok3 := r.find(bench.NameRequestAPIBorrowed, clients)
		if !ok1 || !ok2 || !ok3 || fl.P50 <= alone.P50 {
			continue
		}
		x := float64(api.P50-alone.P50) / float64(fl.P50-alone.P50)
		verdict := "yes"
		if x > 1.1 {
			verdict = "**no**"
		}
		w("| %s (whole request, %d client(s)) | what the in-flight cap alone adds to the handler | %s added | %s | ≤ 1.10× | | | | %s |\n",
			strings.TrimPrefix(bench.NameRequestAPIBorrowed, "request: "), clients, formatDur(api.P50-alone.P50), formatRatio(x), verdict)
	}
	// Issue 30: the whole request through the borrowing rate limit and the
	// in-flight cap keeping its slots costs at most 1.5× the handler alone
	// (a steady client: its slot from memory, the rate from a batch).
	for _, clients := range []int{1, 16} {
		alone, ok1 := r.find(bench.NameRequestAlone, clients)
		kept, ok2 := r.find(bench.NameRequestAPIKept, clients)
		if !ok1 || !ok2 || alone.P50 <= 0 {
			continue
		}
		x := float64(kept.P50) / float64(alone.P50)
		verdict := "yes"
		if x > 1.5 {
			verdict = "**no**"
		}
		w("| %s (whole request, %d client(s)) | the handler alone | %s | %s | ≤ 1.50× | | | | %s |\n",
			strings.TrimPrefix(bench.NameRequestAPIKept, "request: "), clients, formatDur(kept.P50), formatRatio(x), verdict)
	}
	w("%s", wholeRequestNote)
}

// wholeRequestNote follows the table of floors.
const wholeRequestNote = "\nThe whole request's row compares chains measured in rounds of their own (the median round of each); the machine's other work falls on each round differently. Measured request by request, each chain in turn, the same ratio is `go test -bench WholeRequestBorrowed ./cmd/internal/bench/`'s added_ratio.\n"

func join(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
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
