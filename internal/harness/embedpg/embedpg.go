// Package embedpg starts a throwaway PostgreSQL cluster from the server
// binaries installed on the machine (initdb, postgres, pg_ctl,
// pg_basebackup), for the tests and for `go run ./cmd/studio` without a
// database URL. It needs no network and no Docker.
//
// initdb and postgres refuse to run as root, so when the caller is root the
// server runs as the unprivileged "postgres" OS user (SysProcAttr.Credential)
// and its data directory is handed to that user. The server listens on a
// free loopback port with trust authentication; its data directory is a
// temporary one removed by Stop. The server is the caller's child and is
// told to shut down immediately if the caller dies (Pdeathsig), so a killed
// test run leaves no server behind.
package embedpg

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/internal/harness/scratch"
)

// ErrNoBinaries is returned when no PostgreSQL server binaries can be found.
var ErrNoBinaries = errors.New("embedpg: no PostgreSQL server binaries (initdb, postgres, pg_ctl) on PATH or under /usr/lib/postgresql/*/bin; install them (Debian: apt-get install postgresql) or set DATABASE_URL")

// Options configure a cluster. The zero value is ready to use.
type Options struct {
	// Settings are extra postgresql.conf settings passed as -c name=value.
	// Defaults favour speed over durability against an OS crash (fsync off;
	// a crash of the server alone loses nothing committed), which is right for
	// throwaway data, and allow 300 connections.
	Settings map[string]string
	// Log receives the server's output. Default: discarded.
	Log io.Writer
}

// Cluster is a running (or stopped) throwaway PostgreSQL server.
type Cluster struct {
	// Port is the loopback TCP port the server listens on.
	Port int
	// DataDir is the cluster's data directory.
	DataDir string

	binDir   string
	settings map[string]string
	log      io.Writer
	cred     *syscall.Credential
	ownDir   string // directory removed by Stop

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	frozen []int // the processes Freeze stopped, postmaster first
}

// URL returns the connection string of database name on the cluster.
func (c *Cluster) URL(database string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, database)
}

// Start creates a new cluster with initdb and starts it.
func Start(ctx context.Context, opts Options) (*Cluster, error) {
	c, err := prepare(opts)
	if err != nil {
		return nil, err
	}
	if err := c.create(ctx, "initdb", "-D", c.DataDir, "-U", "postgres", "-A", "trust",
		"-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions"); err != nil {
		return nil, err
	}
	return c, nil
}

// create makes c's data directory with the program name and its args, then
// starts the server; on an error the directory goes.
func (c *Cluster) create(ctx context.Context, name string, args ...string) error {
	err := c.run(ctx, name, args...)
	if err == nil {
		err = c.Restart(ctx)
	}
	if err != nil {
		c.removeDir()
	}
	return err
}

// StartReplica makes a streaming read replica of c with pg_basebackup -R and
// starts it on a port of its own. Stop it before c.
func (c *Cluster) StartReplica(ctx context.Context) (*Cluster, error) {
	r, err := prepare(Options{Settings: c.settings, Log: c.log})
	if err != nil {
		return nil, err
	}
	// pg_basebackup wants an empty (or missing) target directory.
	if err := os.Remove(r.DataDir); err != nil {
		r.removeDir()
		return nil, err
	}
	if err := r.create(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(c.Port),
		"-U", "postgres", "-D", r.DataDir, "-R", "-X", "stream", "--no-sync", "-c", "fast"); err != nil {
		return nil, err
	}
	return r, nil
}

func prepare(opts Options) (*Cluster, error) {
	bin, err := findBinDir()
	if err != nil {
		return nil, err
	}
	c := &Cluster{binDir: bin, settings: opts.Settings, log: opts.Log}
	if c.log == nil {
		c.log = io.Discard
	}
	if c.cred, err = scratch.NotAsRoot("PostgreSQL"); err != nil {
		return nil, fmt.Errorf("embedpg: %w", err)
	}
	dir, err := scratch.Dir(dirPrefix)
	if err != nil {
		return nil, err
	}
	c.ownDir = dir
	c.DataDir = filepath.Join(dir, "data")
	if err := os.Mkdir(c.DataDir, 0o700); err != nil {
		c.removeDir()
		return nil, err
	}
	if c.cred != nil {
		for _, p := range []string{dir, c.DataDir} {
			if err := os.Chown(p, int(c.cred.Uid), int(c.cred.Gid)); err != nil {
				c.removeDir()
				return nil, err
			}
		}
	}
	return c, nil
}

// Installation is where the server binaries Start runs keep what an
// extension installs: Lib its shared libraries (citus.so), Share its
// control files (extension/citus.control). Share is empty when there is
// no pg_config beside the binaries to ask.
type Installation struct {
	Bin, Lib, Share string
}

// Installed returns the Installation of the server binaries (initdb,
// postgres, pg_ctl, pg_config when installed) that Start runs, the same
// lookup, for a caller that looks for an extension before it starts a
// cluster. It returns ErrNoBinaries when there are none.
func Installed() (Installation, error) {
	bin, err := findBinDir()
	if err != nil {
		return Installation{}, err
	}
	in := Installation{Bin: bin, Lib: pgConfig(bin, "--pkglibdir"), Share: pgConfig(bin, "--sharedir")}
	if in.Lib == "" { // no pg_config beside the server: Debian's layout
		in.Lib = filepath.Join(filepath.Dir(bin), "lib")
	}
	return in, nil
}

func pgConfig(bin, flag string) string {
	out, err := exec.Command(filepath.Join(bin, "pg_config"), flag).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// findBinDir returns the directory of initdb: on PATH, else the newest
// /usr/lib/postgresql/<version>/bin (Debian does not put it on PATH).
func findBinDir() (string, error) {
	// A symlink on PATH (some images link initdb into /usr/local/bin) is
	// followed to the folder that holds the other binaries too.
	if p, err := exec.LookPath("initdb"); err == nil {
		if real, err := filepath.EvalSymlinks(p); err == nil {
			p = real
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(p), "pg_basebackup")); err == nil {
			return filepath.Dir(p), nil
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoBinaries
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = os.TempDir()
	cmd.Env = append(os.Environ(), "LC_ALL=C", "TZ=UTC")
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Pdeathsig: syscall.SIGQUIT}
	return cmd
}

func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	cmd := c.command(ctx, name, args...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("embedpg: %s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Restart starts the server on its data directory after a Stop or Kill (or
// for the first time), on the same port when it had one.
func (c *Cluster) Restart(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd != nil {
		return errors.New("embedpg: server already running")
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port := c.Port
		if port == 0 {
			p, err := scratch.FreePort()
			if err != nil {
				return err
			}
			port = p
		}
		err := c.startOn(ctx, port)
		if err == nil {
			c.Port = port
			return nil
		}
		lastErr = err
		if c.Port != 0 {
			// A fixed port (a restart) may still be in TIME_WAIT or held by
			// the previous postmaster's last moments: wait and try again.
			time.Sleep(500 * time.Millisecond)
		}
	}
	return lastErr
}

func (c *Cluster) startOn(ctx context.Context, port int) error {
	args := []string{"-D", c.DataDir, "-p", strconv.Itoa(port)}
	settings := map[string]string{
		"listen_addresses":        "127.0.0.1",
		"unix_socket_directories": c.DataDir,
		"fsync":                   "off",
		"full_page_writes":        "off",
		"max_connections":         "300",
		"shared_buffers":          "128MB",
		"log_min_messages":        "warning",
		"logging_collector":       "off",
		"timezone":                "UTC",
	}
	for k, v := range c.settings {
		settings[k] = v
	}
	keys := make([]string, 0, len(settings))
	for k := range settings {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-c", k+"="+settings[k])
	}
	// The server outlives ctx: ctx bounds only the wait for it to accept.
	cmd := c.command(context.Background(), "postgres", args...)
	cmd.Stdout, cmd.Stderr = c.log, c.log
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("embedpg: postgres: %w", err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()

	url := fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable&connect_timeout=2", port)
	deadline := time.Now().Add(60 * time.Second)
	for {
		conn, err := pgx.Connect(ctx, url)
		if err == nil {
			_ = conn.Close(ctx)
			c.cmd, c.done = cmd, done
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("embedpg: postgres exited while starting on port %d: %w", port, err)
		case <-ctx.Done():
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-done
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			<-done
			return fmt.Errorf("embedpg: postgres did not accept connections within 60s: %w", err)
		}
	}
}

// Kill stops the server the way a crash would (pg_ctl stop -m immediate):
// no shutdown checkpoint, so the next start runs crash recovery, which
// empties UNLOGGED tables. The data directory is kept for Restart.
func (c *Cluster) Kill() error { return c.stop("immediate") }

// Shutdown stops the server cleanly (pg_ctl stop -m fast) and keeps the
// data directory for Restart.
func (c *Cluster) Shutdown() error { return c.stop("fast") }

func (c *Cluster) stop(mode string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return nil
	}
	c.thaw()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	err := c.run(ctx, "pg_ctl", "stop", "-D", c.DataDir, "-m", mode, "-w")
	if err != nil {
		_ = c.cmd.Process.Signal(syscall.SIGQUIT)
	}
	scratch.AwaitExit(c.cmd.Process, c.done, 30*time.Second)
	c.cmd, c.done = nil, nil
	return err
}

// Stop shuts the server down and removes its data directory.
func (c *Cluster) Stop() error {
	c.mu.Lock()
	running := c.cmd != nil
	c.mu.Unlock()
	var err error
	if running {
		err = c.stop("immediate")
	}
	c.removeDir()
	return err
}

// Freeze stops the server's processes with SIGSTOP — the postmaster first,
// so that it starts no new ones, then every process it started (backends,
// checkpointer, walwriter, ...) — so that the server hangs rather than
// refuses: connections stay open, the kernel accepts new ones, and nothing
// answers. It is how a stalled primary or a network path that drops packets
// looks to a client. Thaw (or Stop) lets it go on.
func (c *Cluster) Freeze() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return errors.New("embedpg: server not running")
	}
	if c.frozen != nil {
		return nil
	}
	pm := c.cmd.Process.Pid
	if err := syscall.Kill(pm, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("embedpg: SIGSTOP postmaster: %w", err)
	}
	c.frozen = []int{pm}
	// A child forked just before the postmaster stopped is found on a
	// second pass.
	for pass := 0; pass < 2; pass++ {
		for _, pid := range childrenOf(pm) {
			if slices.Contains(c.frozen, pid) {
				continue
			}
			if err := syscall.Kill(pid, syscall.SIGSTOP); err == nil {
				c.frozen = append(c.frozen, pid)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

// Thaw continues the processes Freeze stopped (SIGCONT).
func (c *Cluster) Thaw() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.thaw()
}

func (c *Cluster) thaw() {
	for i := len(c.frozen) - 1; i >= 0; i-- {
		_ = syscall.Kill(c.frozen[i], syscall.SIGCONT)
	}
	c.frozen = nil
}

// childrenOf lists the processes whose parent is pid, from /proc.
func childrenOf(pid int) []int {
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	var out []int
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // gone
		}
		// pid (comm) state ppid ...; comm may hold spaces and parentheses.
		s := string(b)
		end := strings.LastIndexByte(s, ')')
		if end < 0 {
			continue
		}
		fields := strings.Fields(s[end+1:])
		if len(fields) < 2 {
			continue
		}
		if ppid, err := strconv.Atoi(fields[1]); err == nil && ppid == pid {
			if child, err := strconv.Atoi(strings.Fields(s)[0]); err == nil {
				out = append(out, child)
			}
		}
	}
	return out
}

// dirPrefix names a cluster's directory (package scratch).
const dirPrefix = "pglimit-pg-"

func (c *Cluster) removeDir() {
	if c.ownDir != "" {
		_ = os.RemoveAll(c.ownDir)
	}
}
