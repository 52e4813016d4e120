package main

import (
	"bytes"
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// fakeMachine has the files in have (on PATH by name, or by path) and
// records the commands run; install lists what a successful apt-get
// install makes present.
type fakeMachine struct {
	have    []string
	citus   bool // Citus installed (nil check when false and not asked)
	euid    int
	install []string
	ran     [][]string
	out     bytes.Buffer
	err     bytes.Buffer
}

func (f *fakeMachine) machine() machine {
	return machine{
		lookPath: func(file string) (string, error) {
			if slices.Contains(f.have, file) {
				return "/usr/bin/" + file, nil
			}
			return "", exec.ErrNotFound
		},
		glob: func(pattern string) ([]string, error) {
			if slices.Contains(f.have, pattern) {
				return []string{pattern}, nil
			}
			return nil, nil
		},
		euid: f.euid,
		run: func(name string, args ...string) error {
			f.ran = append(f.ran, append([]string{name}, args...))
			if len(args) > 0 && args[0] == "install" {
				f.have = append(f.have, f.install...)
			}
			return nil
		},
		stdout: &f.out,
		stderr: &f.err,
		citus: func() (bool, string) {
			if f.citus {
				return true, "citustest: Citus is installed"
			}
			return false, "citustest: Citus is not installed; build it"
		},
	}
}

var all = []string{"/usr/lib/postgresql/*/bin/initdb", "chromium", "/usr/sbin/pgbouncer", "apt-get"}

func TestInstallDeps(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		args     []string
		have     []string
		euid     int
		install  []string
		wantCode int
		wantRan  []string // commands, joined by spaces
		wantErr  string   // the whole of stderr, "" for nothing
		citus    bool
		wantOut  string // the whole of stdout when it is not an install's
	}{
		{name: "everything there", have: all, euid: 1000, wantCode: 0, citus: true},
		{name: "everything there but Citus", have: all, euid: 1000, wantCode: 0,
			wantOut: "installdeps: optional, the Citus tests skip without it: citustest: Citus is not installed; build it\n"},
		{name: "only postgresql asked, Citus not said", args: []string{"postgresql"}, have: all, euid: 1000, wantCode: 0},
		{name: "initdb on PATH counts", have: []string{"initdb", "chromium", "pgbouncer"}, euid: 1000, wantCode: 0, citus: true},
		{name: "not root, all missing", euid: 1000, wantCode: 1,
			wantErr: "pglimit needs the PostgreSQL server binaries (initdb), chromium and pgbouncer, which this machine lacks; install them, as root: apt-get update && apt-get install -y postgresql chromium pgbouncer; then run the command again\n"},
		{name: "not root, apt-get there, chromium missing", have: []string{"/usr/lib/postgresql/*/bin/initdb", "pgbouncer", "apt-get"}, euid: 1000, wantCode: 1,
			wantErr: "pglimit needs chromium, which this machine lacks; install it, as root: apt-get update && apt-get install -y chromium; then run the command again\n"},
		{name: "only postgresql asked, and there", args: []string{"postgresql"}, have: []string{"initdb"}, euid: 1000, wantCode: 0},
		{name: "root without apt-get", euid: 0, have: []string{"chromium", "pgbouncer"}, wantCode: 1,
			wantErr: "pglimit needs the PostgreSQL server binaries (initdb), which this machine lacks; install it, install the Debian packages postgresql (there is no apt-get here); then run the command again\n"},
		{name: "root installs, update first", euid: 0, have: []string{"apt-get", "chromium"},
			install: []string{"initdb", "pgbouncer"}, wantCode: 0,
			wantRan: []string{"apt-get update -qq", "apt-get install -y -qq --no-install-recommends postgresql pgbouncer"}},
		{name: "root, the install leaves it missing", euid: 0, have: []string{"apt-get"}, wantCode: 1,
			wantRan: []string{"apt-get update -qq", "apt-get install -y -qq --no-install-recommends postgresql chromium pgbouncer"},
			wantErr: "installdeps: apt-get installed postgresql chromium pgbouncer, yet the PostgreSQL server binaries (initdb), chromium and pgbouncer are still missing\n"},
		{name: "unknown package", args: []string{"redis"}, euid: 0, wantCode: 2,
			wantErr: "installdeps: unknown package redis (known: postgresql chromium pgbouncer)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := &fakeMachine{have: tc.have, euid: tc.euid, install: tc.install, citus: tc.citus}
			code := run(tc.args, f.machine())
			var ran []string
			for _, c := range f.ran {
				ran = append(ran, strings.Join(c, " "))
			}
			if code != tc.wantCode || !slices.Equal(ran, tc.wantRan) || f.err.String() != tc.wantErr {
				t.Fatalf("exit %d, ran %q, stderr %q;\nwant exit %d, ran %q, stderr %q", code, ran, f.err.String(), tc.wantCode, tc.wantRan, tc.wantErr)
			}
			if len(tc.wantRan) == 0 && f.out.String() != tc.wantOut {
				t.Fatalf("stdout %q, want %q", f.out.String(), tc.wantOut)
			}
			if strings.Count(f.err.String(), "\n") > 1 {
				t.Fatalf("more than one line: %q", f.err.String())
			}
		})
	}
}

// TestMakeTestRunsItFirst: the README's test command checks the machine
// before any test, and make run / make verify check for PostgreSQL.
func TestMakeTestRunsItFirst(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatal("make is not on PATH")
	}
	for target, want := range map[string]string{
		"test":   "go run ./cmd/installdeps\n",
		"verify": "go run ./cmd/installdeps postgresql\n",
		"run":    "go run ./cmd/installdeps postgresql\n",
	} {
		cmd := exec.Command("make", "-n", "--no-print-directory", target)
		cmd.Dir = "../.."
		cmd.Env = append(cmd.Environ(), "DATABASE_URL=")
		out, err := cmd.Output()
		var exit *exec.ExitError
		if errors.As(err, &exit) {
			t.Fatalf("make -n %s: %v: %s", target, err, exit.Stderr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if first, _, _ := strings.Cut(string(out), "\n"); first+"\n" != want {
			t.Errorf("make %s starts with %q, want %q", target, first, want)
		}
	}
}
