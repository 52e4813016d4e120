package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// clockTick is the unit of the CPU times in /proc/<pid>/stat (USER_HZ): 100
// per second on every Linux architecture Go supports (the kernel's ABI
// fixes it, whatever the kernel's own HZ).
const clockTick = 10 * time.Millisecond

// procTimes are the CPU times of one process, from /proc/<pid>/stat.
type procTimes struct {
	ppid int
	// own is utime + stime: the CPU the process itself used.
	own time.Duration
	// children is cutime + cstime: the CPU of its children that ended and
	// that it waited for.
	children time.Duration
}

// readProc reads /proc/<pid>/stat. Fields after the command name (which is
// in parentheses and may hold spaces) are numbered from 3 in proc(5):
// ppid is 4, utime 14, stime 15, cutime 16, cstime 17.
func readProc(pid int) (procTimes, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	if err != nil {
		return procTimes{}, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return procTimes{}, fmt.Errorf("/proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 15 {
		return procTimes{}, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f)+2)
	}
	num := func(field int) int64 {
		v, _ := strconv.ParseInt(f[field-3], 10, 64)
		return v
	}
	return procTimes{
		ppid:     int(num(4)),
		own:      time.Duration(num(14)+num(15)) * clockTick,
		children: time.Duration(num(16)+num(17)) * clockTick,
	}, nil
}

// childrenOf lists the processes whose parent is pid.
func childrenOf(pid int) []int {
	var out []int
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		child, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if t, err := readProc(child); err == nil && t.ppid == pid {
			out = append(out, child)
		}
	}
	return out
}

// cpuMeter counts the CPU time the database server spends. Two sources:
//
//   - the whole server, when it is a cluster of this run's own: the
//     postmaster's own time, plus the time of its children that ended
//     (cutime and cstime: the postmaster waits for every child it
//     starts), plus the time of those still running. Backends, the WAL
//     writer, the checkpointer, autovacuum workers and the statistics all
//     count, and a process that ends between two readings moves from the
//     last term to the second without being lost.
//   - the run's own backends: the server processes of the connections whose
//     application_name is this run's, from pg_stat_activity. It works on any
//     server whose processes this machine can see (a server of other
//     users too), but counts only those backends: not the WAL writer nor
//     autovacuum, and not a connection that ended between two readings
//     (the run's pools keep theirs).
type cpuMeter struct {
	postmaster int // 0: not the whole server
	appName    string
	pool       *pgxpool.Pool
	// nodes are the whole-server meters of a Citus cluster's workers
	// (this meter is the coordinator's): their CPU is counted in server
	// and, node by node, in nodes.
	nodes []*cpuMeter
}

// cpuReading is one reading of a cpuMeter.
type cpuReading struct {
	server   time.Duration         // whole server (0 when not counted), a cluster's every node
	backends map[int]time.Duration // the run's backends by pid
	nodes    []time.Duration       // a Citus cluster's: the coordinator, then each worker
}

// errNoProc says the server's processes cannot be read on this machine.
var errNoProc = errors.New("the database server's processes are not visible in /proc on this machine (a remote server, or another PID namespace)")

// newCPUMeter finds the server's processes. whole asks for the whole
// server (a cluster of this run's own); the postmaster is then the parent
// of this connection's backend.
func newCPUMeter(ctx context.Context, pool *pgxpool.Pool, appName string, whole bool) (*cpuMeter, error) {
	var pid int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
		return nil, err
	}
	t, err := readProc(pid)
	if err != nil {
		return nil, errNoProc
	}
	m := &cpuMeter{appName: appName, pool: pool}
	if whole {
		m.postmaster = t.ppid
	}
	return m, nil
}

// read takes a reading.
func (m *cpuMeter) read(ctx context.Context) (cpuReading, error) {
	r := cpuReading{backends: map[int]time.Duration{}}
	// An observer query: pg_stat_activity is a catalog view read by pid,
	// not a statement of pglimit's (sqlc's queries are pglimit's own).
	rows, err := m.pool.Query(ctx, "SELECT pid FROM pg_stat_activity WHERE application_name = $1", m.appName)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		if err := rows.Scan(&pid); err != nil {
			return r, err
		}
		if t, err := readProc(pid); err == nil {
			r.backends[pid] = t.own
		}
	}
	if err := rows.Err(); err != nil {
		return r, err
	}
	if m.postmaster != 0 {
		pm, err := readProc(m.postmaster)
		if err != nil {
			return r, fmt.Errorf("postmaster %d: %w", m.postmaster, err)
		}
		r.server = pm.own + pm.children
		for _, c := range childrenOf(m.postmaster) {
			if t, err := readProc(c); err == nil {
				r.server += t.own
			}
		}
	}
	if len(m.nodes) > 0 {
		r.nodes = append(r.nodes, r.server)
		for _, n := range m.nodes {
			nr, err := n.read(ctx)
			if err != nil {
				return r, err
			}
			r.nodes = append(r.nodes, nr.server)
			r.server += nr.server
		}
	}
	return r, nil
}

// cpuUsed is the CPU time spent between two readings.
type cpuUsed struct {
	// Server is the whole server's (0 when it is not counted).
	Server time.Duration
	// Backends is the run's backends'. A backend that started after the
	// first reading counts in full.
	Backends time.Duration
	// Nodes is a Citus cluster's, node by node: the coordinator, then
	// each worker (Server is their sum).
	Nodes []time.Duration
}

// since returns what was spent from a to b.
func since(a, b cpuReading) cpuUsed {
	u := cpuUsed{Server: b.server - a.server}
	for i := range b.nodes {
		u.Nodes = append(u.Nodes, b.nodes[i]-a.nodes[i])
	}
	for pid, t := range b.backends {
		u.Backends += t - a.backends[pid]
	}
	return u
}
