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

// adopterRoots are the modules an adopter may get from pglimit: what the
// library and its tests need (pgx, goose, OpenTelemetry, golang.org/x, the
// test harness of the design card: testcontainers' postgres module and
// go-cmp). Their own dependencies come with them.
var adopterRoots = []string{
	"github.com/jackc/pgx/v5", "github.com/pressly/goose/v3",
	"go.opentelemetry.io/otel", "go.opentelemetry.io/otel/metric", "go.opentelemetry.io/otel/sdk/metric",
	"golang.org/x/time", "golang.org/x/sync", "golang.org/x/text", "golang.org/x/crypto",
	"github.com/testcontainers/testcontainers-go/modules/postgres", "github.com/google/go-cmp",
}

// TestAdopterModule builds a fresh module that imports every public
// package of the library (this checkout, through a replace) and runs go
// mod tidy in it: every module it then requires must be one of
// adopterRoots or a dependency of one (by the module graph), so no
// browser, Redis, Prometheus exporter or sqlc tool graph reaches an
// adopter. (It downloads from the module proxy what the cache lacks.)
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
	var imports []string
	for _, p := range strings.Fields(string(out)) {
		rel := strings.TrimPrefix(strings.TrimPrefix(p, "github.com/pglimit/pglimit"), "/")
		if !strings.Contains("/"+rel+"/", "/internal/") &&
			!strings.HasPrefix(rel, "examples") && rel != "db" {
			imports = append(imports, p)
		}
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
		"go.mod":  "module example.com/adopter\n\ngo 1.26.0\n\nrequire github.com/pglimit/pglimit v0.0.0\n\nreplace github.com/pglimit/pglimit => " + root + "\n",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	gocmd := func(args ...string) string {
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
	gocmd("mod", "tidy")
	required := strings.Fields(gocmd("list", "-m", "-f", "{{if not .Main}}{{.Path}}{{end}}", "all"))
	versions := map[string]string{}
	for _, line := range strings.Split(gocmd("list", "-m", "-f", "{{.Path}} {{.Version}}", "all"), "\n") {
		if path, version, ok := strings.Cut(line, " "); ok {
			versions[path] = version
		}
	}
	// What the roots bring on their own: a second module requiring them
	// alone, at the versions the adopter got.
	roots := filepath.Join(dir, "roots")
	var mod strings.Builder
	mod.WriteString("module example.com/roots\n\ngo 1.26.0\n\nrequire (\n")
	for _, r := range adopterRoots {
		if v := versions[r]; v != "" {
			mod.WriteString("\t" + r + " " + v + "\n")
		}
	}
	mod.WriteString(")\n")
	if err := os.MkdirAll(roots, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(roots, "go.mod"), []byte(mod.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	dir0 := dir
	dir = roots
	allowed := map[string]bool{"github.com/pglimit/pglimit": true}
	for _, m := range strings.Fields(gocmd("list", "-m", "-f", "{{.Path}}", "all")) {
		allowed[m] = true
	}
	dir = dir0
	// And what those bring in the adopter's own graph (a version the
	// adopter's graph selected may need what another did not).
	edges := map[string][]string{}
	for _, line := range strings.Split(gocmd("mod", "graph"), "\n") {
		from, to, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		from, _, _ = strings.Cut(from, "@")
		to, _, _ = strings.Cut(to, "@")
		edges[from] = append(edges[from], to)
	}
	for grew := true; grew; {
		grew = false
		for from, tos := range edges {
			if !allowed[from] || from == "github.com/pglimit/pglimit" || from == "example.com/adopter" {
				continue
			}
			for _, to := range tos {
				if !allowed[to] {
					allowed[to], grew = true, true
				}
			}
		}
	}
	var foreign []string
	for _, m := range required {
		if !allowed[m] {
			foreign = append(foreign, m)
		}
	}
	t.Logf("an adopter importing %d public packages requires %d modules", len(imports), len(required))
	if len(foreign) > 0 {
		t.Errorf("go mod tidy brings in modules that are none of pgx, goose, OpenTelemetry, golang.org/x, the test harness, nor their dependencies: %v", foreign)
	}
	for _, bad := range forbiddenDeps[:3] {
		for _, m := range required {
			if strings.HasPrefix(m, bad) {
				t.Errorf("an adopter requires %s", m)
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
