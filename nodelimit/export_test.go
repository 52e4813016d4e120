package nodelimit

import "golang.org/x/time/rate"

// What the tests check that is not part of the API.

const (
	MetricName  = metricName
	DefaultRate = defaultRate
)

var (
	Share       = share
	ErrRunTwice = errRunTwice
)

type WaitError = waitError

func (e *WaitError) Node() string { return e.node }

// ReadyReplicas is the ready count l computes the shares with.
func ReadyReplicas(l *Limiter) int { return l.readyReplicas() }

// Rate is the node's rate for the whole installation.
func Rate(n *Node) rate.Limit { return n.rate() }

// Burst is the node's burst on this replica.
func Burst(n *Node) int { return n.burst() }

// Waiting is the number of calls waiting in line for n's bucket.
func Waiting(n *Node) int {
	n.b.mu.Lock()
	defer n.b.mu.Unlock()
	return len(n.b.line)
}
