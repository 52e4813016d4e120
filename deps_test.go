package pglimit_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// libraryPackages are the packages a service imports to use pglimit.
var libraryPackages = []string{
	".", "./db", "./sql/schema", "./quota", "./override", "./problem", "./cursor",
	"./middleware/...", "./replica", "./housekeeping", "./nodelimit", "./clientaddr", "./access", "./ban",
	"./limit", "./ratelimit",
}

// forbiddenDeps are the modules of the reference service, the load check,
// the benchmarks and the tests, which must never reach a user's build: a
// browser driver, Redis clients, testcontainers, the Prometheus exporter
// and client, plotting.
var forbiddenDeps = []string{
	"github.com/chromedp/",
	"github.com/redis/",
	"github.com/go-redis/",
	"github.com/testcontainers/",
	"go.opentelemetry.io/otel/exporters/prometheus",
	"github.com/prometheus/",
	"gonum.org/",
}

// TestLibraryDependencies runs go list -deps over the library packages
// (their own code, not their tests) and fails on any dependency of the
// reference service, the load check or the benchmarks.
func TestLibraryDependencies(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", append([]string{"list", "-deps"}, libraryPackages...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps named %d packages: it listed nothing useful\n%s", len(deps), out)
	}
	for _, dep := range deps {
		for _, bad := range forbiddenDeps {
			if strings.HasPrefix(dep, bad) {
				t.Errorf("a library package depends on %s", dep)
			}
		}
		if strings.HasPrefix(dep, "github.com/pglimit/pglimit/cmd/") || strings.HasPrefix(dep, "github.com/pglimit/pglimit/internal/harness/") {
			t.Errorf("a library package depends on %s", dep)
		}
	}
}

// runtimeRoots are the library's direct runtime dependencies that bring
// modules of their own: what they bring is an adopter's cost of those
// libraries, not of pglimit.
var runtimeRoots = []string{"github.com/pressly/goose/v3", "github.com/jackc/pgx/v5", "go.opentelemetry.io/otel/metric"}

// neverBeyondRoots are the module prefixes an adopter may have only where
// the runtime roots bring them (goose brings some grpc and docker
// modules): pglimit's own tests and tools must not add them.
var neverBeyondRoots = []string{
	"github.com/testcontainers/", "github.com/docker/", "github.com/moby/", "github.com/containerd/",
	"google.golang.org/grpc", "go.opentelemetry.io/otel/sdk",
}

// TestAdopterModule builds a fresh HTTP-only service module that imports
// every public package of the library and the test kit (this checkout,
// through replaces of its own) and runs go mod tidy in it, and a second
// module that requires only runtimeRoots at the versions the first
// selected. The first may have at most 5 modules the second lacks, none of
// them testcontainers, Docker's, containerd's, gRPC or the OTel SDK: every
// requirement of the library's go.mod, test-only ones included, lands in
// every adopter's graph (issue 44). (It downloads from the module proxy
// what the cache lacks.)
func TestAdopterModule(t *testing.T) {
	t.Parallel()
	if testing.Short() {
		t.Skip("go mod tidy in a new module")
	}
	root, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "list", "./...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	imports := []string{"github.com/pglimit/pglimit/pgtest"}
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "github.com/pglimit/pglimit"), "/")
		if !strings.Contains("/"+rel+"/", "/internal/") &&
			!strings.HasPrefix(rel, "examples") && rel != "db" {
			imports = append(imports, p)
		}
	}
	if len(imports) < 15 {
		t.Fatalf("go list named %d public packages: it listed nothing useful\n%s", len(imports), out)
	}
	dir := t.TempDir()
	var src strings.Builder
	src.WriteString("package main\n\nimport (\n")
	for _, p := range imports {
		src.WriteString("\t_ \"" + p + "\"\n")
	}
	src.WriteString(")\n\nfunc main() {}\n")
	files := map[string]string{
		"main.go": src.String(),
		"go.mod": "module example.com/adopter\n\ngo 1.26.0\n\n" +
			"require (\n\tgithub.com/pglimit/pglimit v0.0.0\n\tgithub.com/pglimit/pglimit/pgtest v0.0.0\n)\n\n" +
			"replace github.com/pglimit/pglimit => " + root + "\n\n" +
			"replace github.com/pglimit/pglimit/pgtest => " + filepath.Join(root, "pgtest") + "\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(dir string, args ...string) string {
		t.Helper()
		cmd := exec.Command("go", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=-mod=mod")
		out, err := cmd.Output()
		if err != nil {
			var stderr []byte
			if ee, ok := err.(*exec.ExitError); ok {
				stderr = ee.Stderr
			}
			t.Fatalf("go %v: %v\n%s", args, err, stderr)
		}
		return string(out)
	}
	gocmd(dir, "mod", "tidy")
	versions := map[string]string{}
	var adopter []string
	for _, line := range strings.Split(strings.TrimSpace(gocmd(dir, "list", "-m", "-f", "{{.Path}} {{.Version}}", "all")), "\n") {
		path, version, _ := strings.Cut(line, " ")
		versions[path] = version
		adopter = append(adopter, path)
	}

	// What the runtime roots bring on their own: a module that imports a
	// package of each, at the versions the adopter got, tidied the same way.
	roots := filepath.Join(dir, "roots")
	var mod strings.Builder
	mod.WriteString("module example.com/roots\n\ngo 1.26.0\n\nrequire (\n")
	for _, r := range runtimeRoots {
		if versions[r] == "" {
			t.Fatalf("the adopter's graph has no %s", r)
		}
		mod.WriteString("\t" + r + " " + versions[r] + "\n")
	}
	mod.WriteString(")\n")
	if err := os.MkdirAll(roots, 0o755); err != nil {
		t.Fatal(err)
	}
	rootsMain := "package main\n\nimport (\n\t_ \"github.com/jackc/pgx/v5/pgxpool\"\n\t_ \"github.com/pressly/goose/v3\"\n\t_ \"go.opentelemetry.io/otel/metric\"\n)\n\nfunc main() {}\n"
	for name, body := range map[string]string{"go.mod": mod.String(), "main.go": rootsMain} {
		if err := os.WriteFile(filepath.Join(roots, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd(roots, "mod", "tidy")
	base := map[string]bool{}
	baseList := strings.Fields(gocmd(roots, "list", "-m", "-f", "{{.Path}}", "all"))
	for _, m := range baseList {
		base[m] = true
	}

	var beyond []string
	for _, m := range adopter {
		switch {
		case base[m], m == "example.com/adopter", m == "github.com/pglimit/pglimit", m == "github.com/pglimit/pglimit/pgtest":
		default:
			beyond = append(beyond, m)
		}
	}
	t.Logf("an adopter importing %d public packages has %d modules in go list -m all; %s alone, %d; beyond them: %v",
		len(imports), len(adopter), strings.Join(runtimeRoots, ", "), len(baseList), beyond)
	if len(beyond) > 5 {
		t.Errorf("%d modules beyond what goose, pgx and the OTel metric API bring, want at most 5: %v", len(beyond), beyond)
	}
	for _, m := range beyond {
		for _, bad := range neverBeyondRoots {
			if strings.HasPrefix(m, bad) {
				t.Errorf("an adopter gets %s, which goose, pgx and the OTel metric API do not bring", m)
			}
		}
	}
	for _, m := range beyond {
		for _, bad := range forbiddenDeps {
			if strings.HasPrefix(m, bad) {
				t.Errorf("an adopter gets %s from pglimit", m)
			}
		}
	}
}

// TestNoGRPCInLibraryModule runs go list -deps -test over every package of
// the library module, tests included, outside the workspace (GOWORK=off:
// the module as an adopter's build sees it), and fails on any package of
// gRPC, of go-grpc-middleware or of the gRPC front (./grpc, a module of its
// own): a service that only speaks HTTP builds nothing of gRPC.
func TestNoGRPCInLibraryModule(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("go", "list", "-deps", "-test", "./...")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("go list -deps -test ./...: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 100 || !slices.Contains(deps, "github.com/pglimit/pglimit/middleware/ratelimit") {
		t.Fatalf("go list -deps -test named %d packages, without middleware/ratelimit: it listed nothing useful\n%s", len(deps), out)
	}
	for _, dep := range deps {
		for _, bad := range []string{"google.golang.org/grpc", "github.com/grpc-ecosystem/", "github.com/pglimit/pglimit/grpc"} {
			dep = strings.Trim(dep, "[]")
			if dep == strings.TrimSuffix(bad, "/") || strings.HasPrefix(dep, strings.TrimSuffix(bad, "/")+"/") {
				t.Errorf("the library module builds %s", dep)
			}
		}
	}
}

// TestNothingImportsTheRoot: the root package is the front door only. No
// other package of the library module imports it, its in-package tests
// included (only external tests and examples use it, as an adopter does):
// the names it shares with them (ErrLimited, Class, Classify, MaxLimit)
// live in internal/vocab, which the root re-exports.
func TestNothingImportsTheRoot(t *testing.T) {
	t.Parallel()
	const root = "github.com/pglimit/pglimit"
	out, err := exec.Command("go", "list", "-f",
		"{{.ImportPath}}{{range .Imports}} {{.}}{{end}}{{range .TestImports}} {{.}}{{end}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 20 {
		t.Fatalf("go list named %d packages: it listed nothing useful\n%s", len(lines), out)
	}
	for _, line := range lines {
		fields := strings.Fields(line)
		pkg := fields[0]
		if pkg == root || strings.HasPrefix(pkg, root+"/examples/") {
			continue
		}
		if slices.Contains(fields[1:], root) {
			t.Errorf("%s imports the root package %s", pkg, root)
		}
	}
}

// TestTransportsRunNoSQL: the decisions live in engines below the
// transports. No package under middleware/ imports db/ (the generated
// statements), and no engine (the public ones and those under internal/)
// imports net/http.
func TestTransportsRunNoSQL(t *testing.T) {
	t.Parallel()
	const root = "github.com/pglimit/pglimit"
	engines := []string{root + "/ratelimit", root + "/quota", root + "/ban", root + "/access", root + "/override",
		root + "/internal/permit", root + "/internal/slots", root + "/internal/throttle",
		root + "/internal/memo", root + "/internal/observe", root + "/internal/bus"}
	out, err := exec.Command("go", "list", "-f", "{{.ImportPath}}{{range .Imports}} {{.}}{{end}}", "./...").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	seen := 0
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if strings.HasPrefix(pkg, root+"/middleware/") {
			seen++
			if slices.Contains(imports, root+"/db") {
				t.Errorf("%s, a transport, imports %s/db: its statements belong to an engine", pkg, root)
			}
		}
		if slices.Contains(engines, pkg) {
			seen++
			if slices.Contains(imports, "net/http") {
				t.Errorf("%s, an engine, imports net/http", pkg)
			}
		}
	}
	if seen < 8 {
		t.Fatalf("go list named %d transports and engines: it listed nothing useful\n%s", seen, out)
	}
}
