// Package replicaset builds cmd/studio and runs several replicas of it as
// child processes on free loopback ports, for the black-box tests, the
// fault tests and cmd/loadcheck. A replica's output goes to a log file of
// its own, kept for reading when something fails.
package replicaset

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pglimit/pglimit/internal/harness/scratch"
)

var (
	buildMu  sync.Mutex
	built    = map[string]string{}
	buildDir string
)

// Build compiles the main package pkg (e.g. "github.com/pglimit/pglimit/cmd/studio")
// once per process and returns the binary's path.
func Build(pkg string) (string, error) {
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[pkg]; ok {
		return p, nil
	}
	if buildDir == "" {
		d, err := os.MkdirTemp("", "pglimit-bin-")
		if err != nil {
			return "", err
		}
		buildDir = d
	}
	out := filepath.Join(buildDir, filepath.Base(pkg))
	cmd := exec.Command("go", "build", "-o", out, pkg)
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build %s: %w\n%s", pkg, err, b)
	}
	built[pkg] = out
	return out, nil
}

// Cleanup removes the built binaries.
func Cleanup() {
	buildMu.Lock()
	defer buildMu.Unlock()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
		buildDir = ""
		built = map[string]string{}
	}
}

// Proc is one running replica.
type Proc struct {
	// Name is the replica's -replica-name.
	Name string
	// Addr is its listen address, URL its base URL.
	Addr, URL string
	// LogPath is the file its output goes to.
	LogPath string

	binary string
	args   []string
	env    []string

	mu      sync.Mutex
	cmd     *exec.Cmd
	done    chan struct{}
	err     error
	logFrom int64 // the log's size when the process last started
}

// Options describe a set of replicas.
type Options struct {
	// Binary is the studio binary (Build).
	Binary string
	// N is the number of replicas. Default 3.
	N int
	// DatabaseURL is the primary every replica uses. Required.
	DatabaseURL string
	// Args are extra flags given to every replica.
	Args []string
	// LogDir holds the replicas' logs. Default: a new temporary directory.
	LogDir string
	// Env is extra environment for every replica.
	Env []string
}

// Start starts opts.N replicas and waits until each answers /readyz.
func Start(ctx context.Context, opts Options) ([]*Proc, error) {
	if opts.N == 0 {
		opts.N = 3
	}
	if opts.DatabaseURL == "" || opts.Binary == "" {
		return nil, errors.New("replicaset: Binary and DatabaseURL are required")
	}
	if opts.LogDir == "" {
		d, err := os.MkdirTemp("", "pglimit-replicas-")
		if err != nil {
			return nil, err
		}
		opts.LogDir = d
	}
	// Replicas of one installation share the key that signs paging
	// cursors, as an operator configures them.
	key := make([]byte, 32)
	_, _ = rand.Read(key)
	opts.Args = append([]string{"-cursor-key", base64.StdEncoding.EncodeToString(key)}, opts.Args...)
	procs := make([]*Proc, opts.N)
	for i := range procs {
		addr, err := scratch.FreeAddr()
		if err != nil {
			return nil, err
		}
		name := fmt.Sprintf("replica-%d", i+1)
		p := &Proc{
			Name: name, Addr: addr, URL: "http://" + addr,
			LogPath: filepath.Join(opts.LogDir, name+".log"),
			binary:  opts.Binary,
			args: append([]string{"-addr", addr, "-database-url", opts.DatabaseURL, "-replica-name", name,
				"-log-format", "json"}, opts.Args...),
			env: opts.Env,
		}
		procs[i] = p
	}
	var wg sync.WaitGroup
	errs := make([]error, len(procs))
	for i, p := range procs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = p.startOnFreePort(ctx)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		for _, p := range procs {
			p.Stop()
		}
		return nil, err
	}
	return procs, nil
}

// startOnFreePort starts the replica the first time. FreePort's port was
// free when it was picked, not necessarily when the replica binds it (a
// parallel test may take it meanwhile): a replica that exits on "address
// already in use" is started again on another port, a few times.
func (p *Proc) startOnFreePort(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		err := p.Start(ctx)
		if err == nil || attempt == 5 || !p.exitedOnBusyPort() {
			return err
		}
		addr, perr := scratch.FreeAddr()
		if perr != nil {
			return errors.Join(err, perr)
		}
		old := p.Addr
		p.Addr = addr
		p.URL = "http://" + p.Addr
		for i, a := range p.args {
			if a == old {
				p.args[i] = p.Addr
			}
		}
	}
}

// exitedOnBusyPort reports whether the replica has exited and its log,
// since its last start, says its address was taken.
func (p *Proc) exitedOnBusyPort() bool {
	return !p.Running() && strings.Contains(p.logSinceStart(), "address already in use")
}

// servingHere reports whether the replica's log, since its last start,
// says it serves on its address.
func (p *Proc) servingHere() bool {
	log := p.logSinceStart()
	return strings.Contains(log, "studio is serving") && strings.Contains(log, p.Addr)
}

// logSinceStart is what the replica logged since its last start (at most
// its last 64 KB).
func (p *Proc) logSinceStart() string {
	p.mu.Lock()
	from := p.logFrom
	p.mu.Unlock()
	return p.readLog(from, 64<<10)
}

// Start (re)starts the replica and waits until it answers /readyz.
func (p *Proc) Start(ctx context.Context) error {
	logf, err := os.OpenFile(p.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	from := int64(0)
	if st, err := logf.Stat(); err == nil {
		from = st.Size()
	}
	p.mu.Lock()
	p.logFrom = from
	p.mu.Unlock()
	cmd := exec.Command(p.binary, p.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), p.env...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return err
	}
	done := make(chan struct{})
	p.mu.Lock()
	p.cmd, p.done = cmd, done
	p.mu.Unlock()
	go func() {
		err := cmd.Wait()
		logf.Close()
		p.mu.Lock()
		p.err = err
		p.mu.Unlock()
		close(done)
	}()
	return p.WaitReady(ctx, 90*time.Second)
}

// WaitReady polls /readyz until it answers 200.
func (p *Proc) WaitReady(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		resp, err := client.Get(p.URL + "/readyz")
		if err == nil {
			resp.Body.Close()
			// A 200 on the port is this replica's only once its own log,
			// since this start, says it serves there: another test's
			// process may hold a port FreePort handed out.
			if resp.StatusCode == http.StatusOK && p.Running() && p.servingHere() {
				return nil
			}
		}
		select {
		case <-p.done:
			return fmt.Errorf("replicaset: %s exited before it was ready; log %s:\n%s", p.Name, p.LogPath, p.Tail(4000))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("replicaset: %s not ready after %v; log %s:\n%s", p.Name, timeout, p.LogPath, p.Tail(4000))
		}
	}
}

// Kill ends the replica with SIGKILL, as a crash would, and waits for it.
func (p *Proc) Kill() { p.signal(syscall.SIGKILL) }

// Stop ends the replica with SIGTERM (graceful shutdown) and waits for it;
// after 20 s it is killed.
func (p *Proc) Stop() { p.signal(syscall.SIGTERM) }

func (p *Proc) signal(sig syscall.Signal) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	scratch.AwaitExit(cmd.Process, done, 20*time.Second)
}

// Running reports whether the process is alive.
func (p *Proc) Running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// PID is the process id of the replica's current process, 0 before it
// started (a test reads its memory under /proc).
func (p *Proc) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Tail returns the last n bytes of the replica's log.
func (p *Proc) Tail(n int64) string { return p.readLog(0, n) }

// readLog returns the replica's log from offset from, or its last n bytes
// when there are more.
func (p *Proc) readLog(from, n int64) string {
	f, err := os.Open(p.LogPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return ""
	}
	from = max(from, st.Size()-n, 0)
	if st.Size() <= from {
		return ""
	}
	buf := make([]byte, st.Size()-from)
	_, _ = f.ReadAt(buf, from)
	return string(buf)
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) { return scratch.FreePort() }
