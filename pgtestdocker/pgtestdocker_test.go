package pgtestdocker

import (
	"context"
	"net"
	"path/filepath"
	"testing"

	"github.com/pglimit/pglimit/pgtest"
)

func TestMain(m *testing.M) { Main(m) }

// TestTheKitHasAServer: under Main the kit's databases are served and
// migrated (from a container where Docker answers, else as pgtest finds
// its server: on CI, a throwaway cluster).
func TestTheKitHasAServer(t *testing.T) {
	pool := pgtest.Pool(t, pgtest.URL(t), 2)
	var tables int
	if err := pool.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_tables WHERE schemaname = 'pglimit'`).Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables == 0 {
		t.Error("the test's database has no pglimit table: it was not migrated")
	}
}

// TestDockerAnswers: a socket that accepts answers, a missing one and a
// malformed DOCKER_HOST do not, and a TCP daemon is left to testcontainers.
func TestDockerAnswers(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	for _, c := range []struct {
		host string
		want bool
	}{
		{"unix://" + sock, true},
		{"unix://" + sock + ".missing", false},
		{"tcp://127.0.0.1:2375", true},
		{"%zz", false},
	} {
		t.Run(c.host, func(t *testing.T) {
			t.Setenv("DOCKER_HOST", c.host)
			if got := dockerAnswers(); got != c.want {
				t.Errorf("dockerAnswers() with DOCKER_HOST=%q = %v, want %v", c.host, got, c.want)
			}
		})
	}
}
