// Package pgtestdocker runs the tests of pglimit's test kit (package
// pgtest) on a PostgreSQL container, for a machine with a Docker daemon
// and without the PostgreSQL server binaries. It is a module of its own,
// so that testcontainers and Docker's client reach only the module graphs
// of the services that use it.
//
// A package whose tests use pgtest calls this package's Main from its
// TestMain, in place of pgtest.Main:
//
//	func TestMain(m *testing.M) { pgtestdocker.Main(m) }
//
// The tests themselves stay as they are (pgtest.URL, pgtest.Pool).
package pgtestdocker

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"testing"
	"time"

	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"

	"github.com/pglimit/pglimit/pgtest"
)

// Image is the PostgreSQL image Main starts.
const Image = "postgres:15-alpine"

// Main runs the tests as pgtest.Main does, on a container of Image that it
// starts and, after the tests, removes, when neither TEST_DATABASE_URL nor
// DATABASE_URL names a server and a Docker daemon answers. Otherwise, or
// when the container does not start (said on stderr), the kit finds its
// server as it always does: the URL, else a throwaway cluster.
func Main(m *testing.M) {
	if os.Getenv("TEST_DATABASE_URL") != "" || os.Getenv("DATABASE_URL") != "" || !dockerAnswers() {
		pgtest.Main(m)
		return
	}
	u, stop, err := start()
	if err != nil {
		fmt.Fprintf(os.Stderr, "pgtestdocker: no container (%v); the tests find their server without Docker\n", err)
		pgtest.Main(m)
		return
	}
	os.Setenv("TEST_DATABASE_URL", u)
	pgtest.Main(m, stop)
}

// start runs a container of Image and returns its URL and the function
// that removes it.
func start() (string, func(), error) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	c, err := tcpostgres.Run(ctx, Image,
		tcpostgres.WithDatabase("postgres"), tcpostgres.WithUsername("postgres"), tcpostgres.WithPassword("postgres"),
		tcpostgres.BasicWaitStrategies())
	if err != nil {
		return "", nil, err
	}
	stop := func() { _ = c.Terminate(context.Background()) }
	u, err := c.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		stop()
		return "", nil, err
	}
	return u, stop, nil
}

// dockerAnswers reports whether a Docker daemon accepts connections on its
// unix socket (DOCKER_HOST's, else /var/run/docker.sock), without waiting
// on testcontainers' own, slower probing; a TCP DOCKER_HOST is left to
// testcontainers to try.
func dockerAnswers() bool {
	addr := "/var/run/docker.sock"
	if h := os.Getenv("DOCKER_HOST"); h != "" {
		u, err := url.Parse(h)
		if err != nil {
			return false
		}
		if u.Scheme != "unix" {
			return true
		}
		addr = u.Path
	}
	conn, err := net.DialTimeout("unix", addr, time.Second)
	if err != nil {
		return false
	}
	conn.Close()
	return true
}
