// Package pgbouncer starts a throwaway PgBouncer in front of a PostgreSQL
// server, for the tests that prove pglimit works behind a pooler in
// transaction pooling mode. It runs the pgbouncer binary installed on the
// machine (Debian's package puts it in /usr/sbin), as internal/harness/embedpg runs
// the server: a free loopback port, a temporary directory for the
// configuration and the auth file, removed by Stop.
//
// PgBouncer refuses to run as root, so when the caller is root it runs as
// the unprivileged "postgres" OS user (SysProcAttr.Credential), as embedpg
// does with initdb and postgres. It is the caller's child and is told to
// stop if the caller dies (Pdeathsig), so a killed test run leaves no
// pooler behind.
//
// Every database of the upstream server is reachable through it under its
// own name (the "*" entry), as the user of the upstream URL: clients are
// trusted (they are the tests on this machine), and PgBouncer logs in to
// the server with the upstream URL's password, written to the auth file.
package pgbouncer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pglimit/pglimit/internal/harness/scratch"
)

// ErrNotInstalled is returned when no pgbouncer binary can be found.
var ErrNotInstalled = errors.New("pgbouncer: no pgbouncer binary on PATH or in /usr/sbin; install it (Debian: apt-get install pgbouncer, which `make test` does as root) ")

// Pool modes.
const (
	Transaction = "transaction"
	Session     = "session"
)

// Options configure a PgBouncer. The zero value is ready to use.
type Options struct {
	// PoolMode is "transaction" (the default: a server connection is a
	// client's for one transaction only) or "session".
	PoolMode string
	// PoolSize is the most server connections per database and user
	// (default_pool_size). Default 10.
	PoolSize int
	// MaxClientConn is the most client connections. Default 500.
	MaxClientConn int
	// Log receives PgBouncer's own log lines. Default: discarded.
	Log io.Writer
}

// Bouncer is a running PgBouncer.
type Bouncer struct {
	// Port is the loopback TCP port it listens on.
	Port int
	// PoolMode and PoolSize are the settings it runs with.
	PoolMode string
	PoolSize int

	upstream *url.URL
	dir      string
	cmd      *exec.Cmd
	done     chan struct{}
	stopOnce sync.Once
}

// Binary returns the path of the pgbouncer binary: on PATH, else Debian's
// /usr/sbin/pgbouncer (off a user's PATH).
func Binary() (string, error) {
	if p, err := exec.LookPath("pgbouncer"); err == nil {
		return p, nil
	}
	if _, err := os.Stat("/usr/sbin/pgbouncer"); err == nil {
		return "/usr/sbin/pgbouncer", nil
	}
	return "", ErrNotInstalled
}

// Start starts a PgBouncer in front of the server of upstream (a
// postgres:// URL: its host, port, user and password are used; its
// database is not) and waits until it accepts connections.
func Start(ctx context.Context, upstream string, opts Options) (*Bouncer, error) {
	bin, err := Binary()
	if err != nil {
		return nil, err
	}
	up, err := url.Parse(upstream)
	if err != nil || (up.Scheme != "postgres" && up.Scheme != "postgresql") {
		return nil, fmt.Errorf("pgbouncer: upstream must be a postgres:// URL")
	}
	if opts.PoolMode == "" {
		opts.PoolMode = Transaction
	}
	if opts.PoolMode != Transaction && opts.PoolMode != Session {
		return nil, fmt.Errorf("pgbouncer: pool mode %q: want %q or %q", opts.PoolMode, Transaction, Session)
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 10
	}
	if opts.MaxClientConn == 0 {
		opts.MaxClientConn = 500
	}
	if opts.PoolSize < 0 || opts.MaxClientConn < 0 {
		return nil, errors.New("pgbouncer: negative PoolSize or MaxClientConn")
	}
	if opts.Log == nil {
		opts.Log = io.Discard
	}
	cred, err := scratch.NotAsRoot("PgBouncer")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	dir, err := scratch.Dir(dirPrefix)
	if err != nil {
		return nil, err
	}
	b := &Bouncer{PoolMode: opts.PoolMode, PoolSize: opts.PoolSize, upstream: up, dir: dir}
	if err := b.start(ctx, bin, cred, opts); err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	return b, nil
}

func (b *Bouncer) start(ctx context.Context, bin string, cred *syscall.Credential, opts Options) error {
	host := b.upstream.Hostname()
	if host == "" {
		host = "127.0.0.1"
	}
	port := b.upstream.Port()
	if port == "" {
		port = "5432"
	}
	userName := b.upstream.User.Username()
	if userName == "" {
		return errors.New("pgbouncer: the upstream URL names no user")
	}
	password, _ := b.upstream.User.Password()
	files := map[string]string{
		// "username" "password": PgBouncer logs in to the server with it.
		"users.txt": quote(userName) + " " + quote(password) + "\n",
	}
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		listen, err := scratch.FreePort()
		if err != nil {
			return err
		}
		files["pgbouncer.ini"] = strings.Join([]string{
			"[databases]",
			// Every database of the server, under its own name.
			"* = host=" + host + " port=" + port,
			"[pgbouncer]",
			"listen_addr = 127.0.0.1",
			"listen_port = " + strconv.Itoa(listen),
			"unix_socket_dir =",
			"auth_type = trust",
			"auth_file = " + filepath.Join(b.dir, "users.txt"),
			"pool_mode = " + opts.PoolMode,
			"default_pool_size = " + strconv.Itoa(opts.PoolSize),
			"max_client_conn = " + strconv.Itoa(opts.MaxClientConn),
			// Transaction pooling resets nothing between clients by
			// default; session pooling discards the session's state.
			"server_reset_query = DISCARD ALL",
			"log_connections = 0",
			"log_disconnections = 0",
			"",
		}, "\n")
		for name, content := range files {
			p := filepath.Join(b.dir, name)
			if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
				return err
			}
			if cred != nil {
				if err := os.Chown(p, int(cred.Uid), int(cred.Gid)); err != nil {
					return err
				}
			}
		}
		if cred != nil {
			if err := os.Chown(b.dir, int(cred.Uid), int(cred.Gid)); err != nil {
				return err
			}
		}
		cmd := exec.Command(bin, filepath.Join(b.dir, "pgbouncer.ini"))
		cmd.Dir = b.dir
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred, Pdeathsig: syscall.SIGTERM}
		logs := &tail{w: opts.Log}
		cmd.Stdout, cmd.Stderr = logs, logs
		if err := cmd.Start(); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		err = waitListening(ctx, listen, done)
		if err == nil {
			b.Port, b.cmd, b.done = listen, cmd, done
			return nil
		}
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-done
		lastErr = fmt.Errorf("%w; its log:\n%s", err, logs.String())
		if ctx.Err() != nil {
			break
		}
	}
	return lastErr
}

// waitListening waits until 127.0.0.1:port accepts a TCP connection.
func waitListening(ctx context.Context, port int, done <-chan struct{}) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), time.Second)
		if err == nil {
			conn.Close()
			return nil
		}
		select {
		case <-done:
			return errors.New("pgbouncer: exited while starting")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return errors.New("pgbouncer: did not listen within 30s")
		}
	}
}

// URL returns the upstream URL with its host and port replaced by
// PgBouncer's: the same user, password, database and parameters, through
// the pooler.
func (b *Bouncer) URL(upstream string) string {
	u, err := url.Parse(upstream)
	if err != nil {
		return upstream
	}
	u.Host = "127.0.0.1:" + strconv.Itoa(b.Port)
	return u.String()
}

// Stop ends PgBouncer (SIGTERM: at once, closing every connection) and
// removes its directory. It is safe to call more than once.
func (b *Bouncer) Stop() error {
	b.stopOnce.Do(func() {
		if b.cmd != nil {
			_ = b.cmd.Process.Signal(syscall.SIGTERM)
			scratch.AwaitExit(b.cmd.Process, b.done, 10*time.Second)
		}
		_ = os.RemoveAll(b.dir)
	})
	return nil
}

// WithParam returns u with the query parameter name set to value (for
// instance default_query_exec_mode, which pgx reads from the URL).
func WithParam(u, name, value string) string {
	parsed, err := url.Parse(u)
	if err != nil {
		return u
	}
	q := parsed.Query()
	q.Set(name, value)
	parsed.RawQuery = q.Encode()
	return parsed.String()
}

// dirPrefix names a pooler's directory (package scratch).
const dirPrefix = "pglimit-pgbouncer-"

// quote writes s as the auth file wants it: in double quotes, a double
// quote doubled.
func quote(s string) string {
	return `"` + strings.ReplaceAll(s, `"`, `""`) + `"`
}

// tail passes PgBouncer's output on and keeps its last lines, for the error
// of a start that failed.
type tail struct {
	mu    sync.Mutex
	w     io.Writer
	lines []string
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	sc := bufio.NewScanner(strings.NewReader(string(p)))
	for sc.Scan() {
		t.lines = append(t.lines, sc.Text())
		if len(t.lines) > 40 {
			t.lines = t.lines[1:]
		}
	}
	return t.w.Write(p)
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}

// TB is the part of testing.TB that ForTest uses.
type TB interface {
	Helper()
	Cleanup(func())
	Fatalf(format string, args ...any)
}

// ForTest starts a PgBouncer in front of the server of upstream for one
// test and stops it when the test ends. It fails the test when PgBouncer
// is not installed or does not start.
func ForTest(t TB, upstream string, opts Options) *Bouncer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := Start(ctx, upstream, opts)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = b.Stop() })
	return b
}
