// Command installdeps makes sure the machine has what the tests and the
// reference service need beyond Go, before any of them runs: the
// PostgreSQL server binaries (Debian package postgresql: the throwaway
// clusters), chromium (the browser test) and pgbouncer (the PgBouncer
// tests). `make test` runs it first with no arguments (everything);
// `make run` and `make verify` ask for postgresql only.
//
// As root it installs what is missing with apt-get (apt-get update first)
// and checks again. Otherwise, or without apt-get, it prints one line
// saying exactly what to install and exits 1, before any test runs.
// Nothing missing: it says nothing, except, when it checked everything,
// one line when Citus is not installed for the PostgreSQL server binaries
// (it is optional: the Citus tests skip without it) saying how to get it.
//
// It is a Go program rather than a shell script so that its test can run
// it in-process with the machine replaced (nothing installed, not root, a
// fake apt-get) and pin the line a newcomer reads; Go is the one thing
// `make test` may assume.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"

	"github.com/pglimit/pglimit/internal/harness/citustest"
)

// requirement is one Debian package and how to tell it is installed.
type requirement struct {
	// Package is the Debian package that provides it.
	Package string
	// What names it in the message.
	What string
	// Present reports whether the machine has it.
	Present func(m machine) bool
}

// requirements, in the order the message names them.
var requirements = []requirement{
	{"postgresql", "the PostgreSQL server binaries (initdb)", func(m machine) bool {
		// What internal/harness/embedpg looks for: initdb on PATH, else Debian's
		// /usr/lib/postgresql/<version>/bin, which is not on PATH.
		return m.onPath("initdb") || m.exists("/usr/lib/postgresql/*/bin/initdb")
	}},
	{"chromium", "chromium", func(m machine) bool {
		return m.onPath("chromium") // what the browser test runs
	}},
	{"pgbouncer", "pgbouncer", func(m machine) bool {
		return m.onPath("pgbouncer") || m.exists("/usr/sbin/pgbouncer") // Debian's place, off a user's PATH
	}},
}

// machine is what installdeps reads and changes; the test replaces it.
type machine struct {
	lookPath func(file string) (string, error)
	glob     func(pattern string) ([]string, error)
	euid     int
	// run runs a command (apt-get) with its output to the user.
	run            func(name string, args ...string) error
	stdout, stderr io.Writer
	// citus reports whether Citus is installed, and the line saying so
	// (internal/harness/citustest.Installed).
	citus func() (bool, string)
}

func (m machine) onPath(file string) bool {
	_, err := m.lookPath(file)
	return err == nil
}

func (m machine) exists(pattern string) bool {
	found, err := m.glob(pattern)
	return err == nil && len(found) > 0
}

func main() {
	m := machine{
		lookPath: exec.LookPath,
		glob:     filepath.Glob,
		euid:     os.Geteuid(),
		run: func(name string, args ...string) error {
			cmd := exec.Command(name, args...)
			cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
			cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
			return cmd.Run()
		},
		stdout: os.Stdout,
		stderr: os.Stderr,
		citus:  citustest.Installed,
	}
	os.Exit(run(os.Args[1:], m))
}

// run checks (and as root installs) the packages named in args, all of
// them when there are none, and returns the exit code.
func run(args []string, m machine) int {
	fs := flag.NewFlagSet("installdeps", flag.ContinueOnError)
	fs.SetOutput(m.stderr)
	fs.Usage = func() {
		fmt.Fprintf(m.stderr, "usage: installdeps [package ...]  (packages: %s; default all)\n", strings.Join(packageNames(), " "))
	}
	if err := fs.Parse(args); err != nil {
		return 2
	}
	wanted, err := choose(fs.Args())
	if err != nil {
		fmt.Fprintf(m.stderr, "installdeps: %v\n", err)
		return 2
	}
	missing := missingOf(wanted, m)
	if len(missing) == 0 {
		sayCitus(fs.Args(), m)
		return 0
	}
	pkgs := packagesOf(missing)
	if m.euid != 0 || !m.onPath("apt-get") {
		how := "as root: apt-get update && apt-get install -y " + strings.Join(pkgs, " ")
		if m.euid == 0 {
			how = "install the Debian packages " + strings.Join(pkgs, " ") + " (there is no apt-get here)"
		}
		fmt.Fprintf(m.stderr, "pglimit needs %s, which this machine lacks; install %s, %s; then run the command again\n",
			whatOf(missing), plural(missing), how)
		return 1
	}
	fmt.Fprintf(m.stdout, "installdeps: installing %s with apt-get\n", strings.Join(pkgs, " "))
	if err := m.run("apt-get", "update", "-qq"); err != nil {
		fmt.Fprintf(m.stderr, "installdeps: apt-get update: %v\n", err)
		return 1
	}
	install := append([]string{"install", "-y", "-qq", "--no-install-recommends"}, pkgs...)
	if err := m.run("apt-get", install...); err != nil {
		fmt.Fprintf(m.stderr, "installdeps: apt-get install %s: %v\n", strings.Join(pkgs, " "), err)
		return 1
	}
	if still := missingOf(wanted, m); len(still) > 0 {
		verb := "is"
		if len(still) > 1 {
			verb = "are"
		}
		fmt.Fprintf(m.stderr, "installdeps: apt-get installed %s, yet %s %s still missing\n", strings.Join(pkgs, " "), whatOf(still), verb)
		return 1
	}
	sayCitus(fs.Args(), m)
	return 0
}

// sayCitus prints one line when everything was checked and Citus is not
// installed: it is optional, and says how to get it.
func sayCitus(args []string, m machine) {
	if len(args) > 0 || m.citus == nil {
		return
	}
	if ok, line := m.citus(); !ok {
		fmt.Fprintf(m.stdout, "installdeps: optional, the Citus tests skip without it: %s\n", line)
	}
}

func packageNames() []string {
	var names []string
	for _, r := range requirements {
		names = append(names, r.Package)
	}
	return names
}

// choose returns the requirements named (all for none).
func choose(names []string) ([]requirement, error) {
	if len(names) == 0 {
		return requirements, nil
	}
	var out []requirement
	for _, r := range requirements {
		if slices.Contains(names, r.Package) {
			out = append(out, r)
		}
	}
	for _, n := range names {
		if !slices.Contains(packageNames(), n) {
			return nil, errors.New("unknown package " + n + " (known: " + strings.Join(packageNames(), " ") + ")")
		}
	}
	return out, nil
}

func missingOf(wanted []requirement, m machine) []requirement {
	var missing []requirement
	for _, r := range wanted {
		if !r.Present(m) {
			missing = append(missing, r)
		}
	}
	return missing
}

func packagesOf(rs []requirement) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.Package)
	}
	return out
}

func plural(rs []requirement) string {
	if len(rs) == 1 {
		return "it"
	}
	return "them"
}

// whatOf names the requirements for a sentence: "a, b and c".
func whatOf(rs []requirement) string {
	var names []string
	for _, r := range rs {
		names = append(names, r.What)
	}
	if len(names) == 1 {
		return names[0]
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}
