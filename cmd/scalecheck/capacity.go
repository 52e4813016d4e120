package main

import "time"

// Assumptions turn operations into requests, users and replicas. They are
// stated in the report beside the figures, so a reader can redo the
// arithmetic with their own.
type Assumptions struct {
	// UserRate is the requests per second of one active user.
	UserRate float64
	// HeavyShare is the share of requests that are heavy (an export, a
	// history page, the SQL console).
	HeavyShare float64
	// SignInsPerHour is one user's sign-ins per hour, FailedShare the share
	// of them that fail.
	SignInsPerHour, FailedShare float64
	// UploadsPerHour is one user's uploads per hour.
	UploadsPerHour float64
	// ReplicaRate is the requests per second one replica serves.
	ReplicaRate float64
	// Headroom is the share of a core to plan for (a database run at its
	// last cycle answers late).
	Headroom float64
}

// DefaultAssumptions are those of the report.
var DefaultAssumptions = Assumptions{
	UserRate: 0.1, HeavyShare: 0.01,
	SignInsPerHour: 1, FailedShare: 0.1, UploadsPerHour: 0.1,
	ReplicaRate: 200, Headroom: 0.5,
}

// Part is one term of a request's cost.
type Part struct {
	What string
	// PerRequest is how many of the operation one request makes.
	PerRequest float64
	// Server and Client are the CPU one operation costs the database and
	// the replica.
	Server, Client time.Duration
}

// ServerPerRequest is the part's server CPU per request.
func (p Part) ServerPerRequest() time.Duration {
	return time.Duration(p.PerRequest * float64(p.Server))
}

// ClientPerRequest is the part's replica CPU per request.
func (p Part) ClientPerRequest() time.Duration {
	return time.Duration(p.PerRequest * float64(p.Client))
}

// Capacity is what one core of PostgreSQL sustains under the assumptions.
type Capacity struct {
	Assumptions
	Parts []Part
	// Server and Client are the CPU of one request's limits.
	Server, Client time.Duration
	// Requests is requests per core-second; Users the active users and
	// Replicas the replicas one core serves at Headroom.
	Requests, Users, Replicas float64
	// RequestsNoInflight is Requests for a service that limits the rate of
	// every request but caps no token's requests in flight.
	RequestsNoInflight float64
	// RequestsBorrowed is Requests with the rate limit borrowing
	// (ratelimit.Options.Borrow): the rate's part measured on a hot key.
	// RateAlone and RateAloneBorrowed are the requests a second one core
	// decides for a service that limits only the rate.
	RequestsBorrowed, RateAlone, RateAloneBorrowed float64
	// RequestsKept is RequestsBorrowed with the in-flight cap keeping its
	// slots (inflight.Options.Keep) for steady clients: the in-flight part
	// measured on tokens that come back to the replica that served them.
	// KeptServer is what a kept request's in-flight part costs the server;
	// KeptStatements the statements it sends per request (-1: not
	// counted, the server has no pg_stat_statements).
	RequestsKept   float64
	KeptServer     time.Duration
	KeptStatements float64
}

// worst returns the costliest measurement of an operation (of every number
// of clients): the conservative figure.
func (r *Report) worst(name string) OpResult {
	var w OpResult
	for _, o := range r.Ops {
		if o.Name == name && o.ServerCPU() > 0 && o.ServerPerOp() > w.ServerPerOp() {
			w = o
		}
	}
	return w
}

// costliest is the costliest measurement of an operation among all that
// ran, one that counted no server CPU included (worst skips those): a
// decision from memory may send no statement in a short measurement.
func (r *Report) costliest(name string) OpResult {
	var w OpResult
	for _, o := range r.Ops {
		if o.Name == name && o.Ops > 0 && (w.Ops == 0 || o.ServerPerOp() > w.ServerPerOp()) {
			w = o
		}
	}
	return w
}

// Capacity computes the requests, users and replicas one core serves.
func (r *Report) Capacity(a Assumptions) Capacity {
	c := Capacity{Assumptions: a}
	perUserHour := 3600 * a.UserRate // requests of a user in an hour
	add := func(what, op string, perRequest float64) {
		o := r.worst(op)
		c.Parts = append(c.Parts, Part{What: what, PerRequest: perRequest, Server: o.ServerPerOp(), Client: o.ClientPerOp()})
	}
	add("every request: its token's in-flight slot", OpInflight, 1)
	add("every request: its token's rate", OpRate, 1)
	add("heavy requests: their permits", OpHeavy, a.HeavyShare)
	add("sign-ins that succeed: the check", OpCheck, a.SignInsPerHour*(1-a.FailedShare)/perUserHour)
	add("sign-ins that fail: check and record", OpFailure, a.SignInsPerHour*a.FailedShare/perUserHour)
	add("uploads: the window's slot", OpUpload, a.UploadsPerHour/perUserHour)
	var noInflight time.Duration
	for i, p := range c.Parts {
		c.Server += p.ServerPerRequest()
		c.Client += p.ClientPerRequest()
		if i != 0 {
			noInflight += p.ServerPerRequest()
		}
	}
	if c.Server > 0 {
		c.Requests = float64(time.Second) / float64(c.Server)
		c.Users = c.Requests * a.Headroom / a.UserRate
		c.Replicas = c.Requests * a.Headroom / a.ReplicaRate
	}
	if noInflight > 0 {
		c.RequestsNoInflight = float64(time.Second) / float64(noInflight)
	}
	// A borrowed decision, like a kept request, may cost the server no CPU
	// a short run on a loaded machine can count (no statement at all in
	// its measurement): the figures with it need it measured, not costly.
	rate, borrowedOp := r.worst(OpRate).ServerPerOp(), r.costliest(OpRateBorrowed)
	borrowed := borrowedOp.ServerPerOp()
	if rate > 0 {
		c.RateAlone = float64(time.Second) / float64(rate)
	}
	if borrowed > 0 {
		c.RateAloneBorrowed = float64(time.Second) / float64(borrowed)
	}
	if borrowedOp.Ops > 0 {
		if with := c.Server - c.Parts[1].ServerPerRequest() + borrowed; with > 0 {
			c.RequestsBorrowed = float64(time.Second) / float64(with)
		}
	}
	kept := r.costliest(OpInflightKept)
	if kept.Ops > 0 && borrowedOp.Ops > 0 {
		c.KeptServer = kept.ServerPerOp()
		if with := c.Server - c.Parts[0].ServerPerRequest() - c.Parts[1].ServerPerRequest() + c.KeptServer + borrowed; with > 0 {
			c.RequestsKept = float64(time.Second) / float64(with)
		}
		c.KeptStatements = -1
		if kept.StatementTime >= 0 {
			c.KeptStatements = float64(kept.Calls) / float64(kept.Ops)
		}
	}
	return c
}

// CoresAt is the share of a core the limits take at rps requests per
// second.
func (c Capacity) CoresAt(rps float64) float64 { return rps * c.Server.Seconds() }

// Worst is the costliest measurement of an operation, in server CPU per
// operation: the figure the capacity rests on.
func (r *Report) Worst(name string) OpResult { return r.worst(name) }

// BusyConnections is how many connections of a replica's pool the limits
// keep busy at rps requests per second: each request's in-flight claim and
// release and its rate decision, at their single-client latency (Little's
// law: busy connections = arrival rate × time each holds one).
func (r *Report) BusyConnections(rps float64) float64 {
	lowest := r.Clients[0]
	inflight, _ := r.Op(OpInflight, lowest)
	rate, _ := r.Op(OpRate, lowest)
	return rps * (inflight.P50 + rate.P50).Seconds()
}
