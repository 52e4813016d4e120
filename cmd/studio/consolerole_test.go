package main_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestConsoleRoleMadeByAnother: the studio_console role exists on the
// server (roles are the whole cluster's: an administrator, or a superuser's
// migration of another database, made it), and the service's own role may
// not create roles. The migrations still give the role the history tables,
// so the console, which logs in as studio_console, reads them; the log says
// that its users can see and end each other's statements.
func TestConsoleRoleMadeByAnother(t *testing.T) {
	t.Parallel()
	cluster := pgtest.Cluster(t)
	admin := pgtest.Pool(t, cluster.URL("postgres"), 1)
	for _, stmt := range []string{
		`CREATE ROLE studio_console LOGIN`,
		`CREATE ROLE service LOGIN`,
		`CREATE DATABASE app OWNER service`,
	} {
		if _, err := admin.Exec(context.Background(), stmt); err != nil {
			t.Fatal(err)
		}
	}
	procs := studioOn(t, strings.Replace(cluster.URL("app"), "postgres@", "service@", 1), 1)
	r := call(t, http.MethodPost, procs[0].URL+"/api/sql", "alice-token",
		map[string]string{"sql": "SELECT session_user::text, count(*) FROM audit_event"})
	rows := r.rows(t)
	if len(rows) != 1 {
		t.Fatalf("%d rows: %s", len(rows), r.Body)
	}
	row := as[[]any](t, rows[0], "row")
	if row[0] != "studio_console" || as[float64](t, row[1], "count") < 100000 {
		t.Fatalf("console as %v read %v audit events; want studio_console and the demo's 100,000", row[0], row[1])
	}
	// Without CREATEROLE the console users share that role, and the log
	// says what that loses (issue 27).
	if log := procs[0].Tail(1 << 20); !strings.Contains(log, "logs in as studio_console") || !strings.Contains(log, "cancel or terminate them") {
		t.Errorf("no log line says the console users share one role:\n%s", log)
	}
}
