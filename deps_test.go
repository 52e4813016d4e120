package pglimit_test

import (
	"os/exec"
	"strings"
	"testing"
)

// libraryPackages are the packages a service imports to use pglimit.
var libraryPackages = []string{
	".", "./db", "./sql/schema", "./permit", "./problem", "./cursor",
	"./middleware/...", "./replica", "./housekeeping", "./nodelimit",
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
		if strings.HasPrefix(dep, "github.com/pglimit/pglimit/cmd/") || dep == "github.com/pglimit/pglimit/internal/bench" ||
			dep == "github.com/pglimit/pglimit/internal/jolokia" || dep == "github.com/pglimit/pglimit/internal/fakenode" ||
			dep == "github.com/pglimit/pglimit/internal/pgtest" {
			t.Errorf("a library package depends on %s", dep)
		}
	}
}
