package main

import (
	"fmt"
	"io"
	"sort"
	"strconv"
	"text/tabwriter"
	"time"
)

// Verdict is the judgement of one limit.
type Verdict string

// Verdicts.
const (
	// VerdictOK: the observer never saw more than the limit, and the load
	// reached it.
	VerdictOK Verdict = "ok"
	// VerdictExceeded: the observer saw more than the limit.
	VerdictExceeded Verdict = "EXCEEDED"
	// VerdictNotReached: nothing was refused and the observer never saw
	// the limit reached; the load proved nothing about it.
	VerdictNotReached Verdict = "not reached"
	// VerdictDocumented: above the limit in a way the design documents
	// (sign-in normal mode, node rate rounding); not a failure.
	VerdictDocumented Verdict = "documented"
)

// Row is one limit's line of the report.
type Row struct {
	Limit      string
	Configured string
	Cap        int
	// Highest is the most the independent observer saw.
	Highest  int
	Requests int
	Refused  int
	// FalseRefusals is -1 where a limit does not refuse (the node rate
	// makes a call wait).
	FalseRefusals int
	Verdict       Verdict
	Note          string
}

// Report is a load check's outcome.
type Report struct {
	Config Config
	Rows   []Row
	// Unexpected counts answers the load did not expect (5xx, transport
	// errors), by kind, status and slug.
	Unexpected map[string]int
	// Samples and SampleInterval describe the pg_stat_activity observer.
	Samples        int
	SampleInterval time.Duration
	// Nodes is the number of servers the observer polled (the nodes of a
	// Citus cluster, or one).
	Nodes int
	// LogDir holds the children's logs; "" when they were removed.
	LogDir string
}

// Exceeded reports whether any limit was exceeded.
func (r *Report) Exceeded() bool {
	for _, row := range r.Rows {
		if row.Verdict == VerdictExceeded {
			return true
		}
	}
	return false
}

// Failed reports whether the check failed: a limit exceeded or answers
// the load did not expect.
func (r *Report) Failed() bool { return r.Exceeded() || len(r.Unexpected) > 0 }

// Row returns the row of the limit named name.
func (r *Report) Row(name string) (Row, bool) {
	for _, row := range r.Rows {
		if row.Limit == name {
			return row, true
		}
	}
	return Row{}, false
}

// Print writes the table, the definitions and where the logs are.
func (r *Report) Print(w io.Writer) {
	c := r.Config
	fmt.Fprintf(w, "\npglimit load check: %d replicas of cmd/studio, %v of load\n\n", c.Replicas, c.Duration)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "limit\tconfigured\thighest observed\trequests\trefused\tfalse refusals\tverdict")
	for _, row := range r.Rows {
		fr := "-"
		if row.FalseRefusals >= 0 {
			fr = strconv.Itoa(row.FalseRefusals)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%s\t%s\n", row.Limit, row.Configured, row.Highest, row.Requests, row.Refused, fr, row.Verdict)
	}
	tw.Flush()
	for _, row := range r.Rows {
		if row.Note != "" {
			fmt.Fprintf(w, "  %s: %s\n", row.Limit, row.Note)
		}
	}
	if len(r.Unexpected) > 0 {
		fmt.Fprintln(w, "\nunexpected answers:")
		keys := make([]string, 0, len(r.Unexpected))
		for k := range r.Unexpected {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			fmt.Fprintf(w, "  %6d  %s\n", r.Unexpected[k], k)
		}
	}
	fmt.Fprintf(w, `
observers (none of them reads pglimit's tables, but the bans' observer its table of bans):
  sql-console, installation, in-flight: pg_stat_activity of %d server(s), polled %d times (every %v on average),
    counting active console statements by the marker in their text ('lc-<run>:<user>:<token>');
    a statement is active only while its request holds its permit and its slot, so a count
    above the limit is an over-grant, never a sampling artefact.
  sign-in: the answers; highest = most 401 invalid-credentials for one username in its window.
  uploads: the answers; highest = most 201 for one user whose requests (send to answer) all
    fit in less than one window, so their claims were less than a window apart.
  node rate: the fake node's own record of the calls it received, each stamped with the time
    the kernel received its first byte (SO_TIMESTAMPNS), not when the node got to it, so a
    starved load check does not bunch them; from the end of the warm-up (every replica
    answered rate.replica = ceil(rate/replicas)); highest = most calls in one whole second,
    from a second after the load began. Verdict: EXCEEDED when the calls of any interval of
    length L are more than the node limiter's bound, every replica's bucket (share × (1 + L))
    together, burst + rate × L with burst = rate = replicas × share, the interval lengthened
    by %v, the most a call takes from its turn to the node (its replica's sending of it).
  api rate: the answers, per user (every user of the load, all its tokens together);
    highest = most requests of one user admitted (anything but 429 too-many-requests) in an
    interval, less the rate × the interval, measured from the first one's send to the last
    one's answer: the decisions all fell within it, so more than the burst is an over-grant,
    and latency only makes it look smaller. Every /api/ answer but the sign-in's must carry
    RateLimit-Policy and RateLimit of the policy api. A rate refusal is false when, counting
    every request of the user that may have been admitted before its answer, the user had
    room at every moment the refusal may have been decided.
  address rate: the answers, per client address claimed through the stand-in proxy
    127.0.0.2 the replicas trust (X-Forwarded-For), of every request without a token (the
    address load's, and each sign-in round's from an address of its own); judged as the api
    rate. Each such answer must carry RateLimit-Policy and RateLimit of the policy address.
  bans (with -ban-after): the bans an observer polling pglimit.ban saw (key, start, end) and
    the answers per ban key (user:NAME with a token, address:ADDR without); highest = requests
    of a banned key sent a second or more after its ban began (every replica knows of it by
    then) and answered 100 ms or more before it ended, that were not refused as banned; the
    limit is 0. A 429 banned is false unless the observer saw a ban of its key in force during
    the request and the ledger holds -ban-after rate refusals of the key that its ban can have
    counted.
false refusal: a 429 of a limit although, by the client's ledger of every request it sent,
  fewer than the limit's value of other requests of the same scope can have held a slot at
  any moment between the refused request's send and its answer (a request is a possible
  holder from its send to its answer + %v slack, + the window for uploads and failed
  sign-ins, unless it was refused before it could claim). Only the load check drives the
  service, so this can miss a false refusal, never invent one.
`, r.Nodes, r.Samples, r.SampleInterval.Round(time.Microsecond), c.NodeDelivery, c.Slack)
	if r.LogDir != "" {
		fmt.Fprintf(w, "\nlogs of the replicas and the database: %s\n", r.LogDir)
	}
	switch {
	case r.Exceeded():
		fmt.Fprintln(w, "\nFAIL: a limit was exceeded")
	case r.Failed():
		fmt.Fprintln(w, "\nFAIL: unexpected answers")
	default:
		fmt.Fprintln(w, "\nPASS: no limit exceeded")
	}
}
