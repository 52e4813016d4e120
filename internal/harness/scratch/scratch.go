// Package scratch is what the harness's throwaway servers (embedpg's
// clusters, pgbouncer's poolers, replicaset's replicas) share: a directory
// of their own that names the process owning it, swept once that process
// is gone, a free loopback port, and the wait for a process to exit.
package scratch

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ownerFile names the pid of the process a directory belongs to.
const ownerFile = "owner.pid"

// Dir sweeps the directories of prefix whose owner is gone, then makes a
// new one under the temp directory, named prefix and a random suffix,
// owned by this process.
func Dir(prefix string) (string, error) {
	Sweep(prefix)
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		_ = os.RemoveAll(dir)
		return "", err
	}
	return dir, nil
}

// Sweep removes the directories of prefix whose owning process is gone (a
// test binary killed before its cleanup ran): their servers died with
// their owner (Pdeathsig), only the files were left.
func Sweep(prefix string) {
	dirs, _ := filepath.Glob(filepath.Join(os.TempDir(), prefix+"*"))
	for _, d := range dirs {
		b, err := os.ReadFile(filepath.Join(d, ownerFile))
		if err != nil {
			continue // being created, or not ours
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			continue
		}
		if err := syscall.Kill(pid, 0); err == nil || errors.Is(err, syscall.EPERM) {
			continue // owner alive
		}
		_ = os.RemoveAll(d)
	}
}

// FreePort returns a loopback TCP port that was free a moment ago.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns a loopback TCP address, host and port, that was free a
// moment ago.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), nil
}

// NotAsRoot is the credential a server that refuses to run as root
// (PostgreSQL, PgBouncer) is started with: the OS user postgres when this
// process is root, nil (this process's own) otherwise. what names the
// server in the error when there is no such user.
func NotAsRoot(what string) (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, and %s refuses to; no 'postgres' OS user to run it as: %w", what, err)
	}
	uid, _ := strconv.Atoi(u.Uid)
	gid, _ := strconv.Atoi(u.Gid)
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// AwaitExit waits until done is closed (the process p has exited) for up
// to grace, then kills p and waits on.
func AwaitExit(p *os.Process, done <-chan struct{}, grace time.Duration) {
	select {
	case <-done:
	case <-time.After(grace):
		_ = p.Kill()
		<-done
	}
}
