package main

import (
	"fmt"
	"sort"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Config
	Started time.Time
	Wall    time.Duration
	// CPUs is the machine's; LoadStart and LoadEnd its load averages.
	CPUs               int
	LoadStart, LoadEnd string
	Server, Version    string
	CPUSource          string
	Ops                []OpResult
	Churn              *Churn
	// Citus is the operations on a Citus cluster (-citus), or nil.
	Citus  *CitusRun
	Errors map[string]string
}

// Op returns the result of the operation name at the given clients.
func (r *Report) Op(name string, clients int) (OpResult, bool) { return findOp(r.Ops, name, clients) }

// opProblems lists the failed, refused and empty operations of ops, each
// line starting with prefix; errorOf names an operation's first error in
// r.Errors.
func (r *Report) opProblems(prefix string, ops []OpResult, errorOf func(string) string) []string {
	var out []string
	for _, o := range ops {
		if o.Errors > 0 {
			out = append(out, fmt.Sprintf("%s%s at %d clients: %d operations failed (first: %s)", prefix, o.Name, o.Clients, o.Errors, r.Errors[errorOf(o.Name)]))
		}
		if o.Refused > 0 {
			out = append(out, fmt.Sprintf("%s%s at %d clients: %d operations refused, where each client's own key should never reach its limit", prefix, o.Name, o.Clients, o.Refused))
		}
		if o.Ops == 0 {
			out = append(out, fmt.Sprintf("%s%s at %d clients: no operation completed", prefix, o.Name, o.Clients))
		}
	}
	return out
}

// findOp returns the result of the operation name at the given clients.
func findOp(ops []OpResult, name string, clients int) (OpResult, bool) {
	for _, o := range ops {
		if o.Name == name && o.Clients == clients {
			return o, true
		}
	}
	return OpResult{}, false
}

// Problems lists what went wrong: failed or refused operations, limit
// tables holding more rows than the slots in use, rows left after the
// windows lapsed and housekeeping swept.
func (r *Report) Problems() []string {
	out := r.opProblems("", r.Ops, func(op string) string { return op })
	if r.Citus != nil {
		out = append(out, r.opProblems("on citus, ", r.Citus.Ops, citusName)...)
		out = append(out, r.opProblems("on citus, sent to the workers, ", r.Citus.OnWorkers, citusName)...)
	}
	if c := r.Churn; c != nil {
		if c.Errors > 0 {
			var ops []string
			for op := range r.Errors {
				ops = append(ops, op)
			}
			sort.Strings(ops)
			first := ""
			if len(ops) > 0 {
				first = ops[0] + ": " + r.Errors[ops[0]]
			}
			out = append(out, fmt.Sprintf("churn: %d operations failed (%s)", c.Errors, first))
		}
		for _, s := range c.Samples {
			// Each worker holds at most one heavy permit (a slot of its
			// user and one of the installation) or one in-flight slot.
			if n := s.Held["heavy_permit"]; n > int64(2*r.Workers) {
				out = append(out, fmt.Sprintf("churn at %v: heavy_permit holds %d live slots, more than the %d slots %d workers can hold", s.At.Round(time.Second), n, 2*r.Workers, r.Workers))
			}
			if n := s.Held["request_in_flight"]; n > int64(r.Workers) {
				out = append(out, fmt.Sprintf("churn at %v: request_in_flight holds %d live slots, more than the %d slots the workers can hold", s.At.Round(time.Second), n, r.Workers))
			}
			if !s.Final {
				continue
			}
			for _, t := range s.Tables {
				// refusal_minute keeps its rows an hour after their minute.
				if t.Name != "refusal_minute" && t.Rows > 0 {
					out = append(out, fmt.Sprintf("after the churn, its windows and a sweep: %s still holds %d rows", t.Name, t.Rows))
				}
			}
		}
	}
	return out
}

// kB formats a size in bytes.
func kB(b int64) string {
	switch {
	case b >= 10<<20:
		return fmt.Sprintf("%.0f MB", float64(b)/(1<<20))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MB", float64(b)/(1<<20))
	default:
		return fmt.Sprintf("%d kB", b>>10)
	}
}
