package respond

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglimit/pglimit/problem"
)

// TestDatabaseNeverLeaksErrorText answers an unreachable database with a
// 503 and anything else with a 500, neither carrying the error's text, and
// a client that went away with nothing.
func TestDatabaseNeverLeaksErrorText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		status int
		slug   string
	}{
		{&pgconn.PgError{Code: "57P01", Message: "secret-shutdown-text"}, http.StatusServiceUnavailable, "database-unavailable"},
		{&pgconn.PgError{Code: "25006", Message: "secret-read-only-text"}, http.StatusServiceUnavailable, "database-unavailable"},
		{&pgconn.PgError{Code: "40P01", Message: "secret-deadlock-text"}, http.StatusServiceUnavailable, "database-unavailable"},
		{errors.New("conn closed secret-text"), http.StatusServiceUnavailable, "database-unavailable"},
		{fmt.Errorf("query: %w", context.DeadlineExceeded), http.StatusServiceUnavailable, "database-unavailable"},
		{&pgconn.PgError{Code: "23505", Message: "secret-constraint-text"}, http.StatusInternalServerError, "internal-error"},
		{errors.New("secret-internal-text"), http.StatusInternalServerError, "internal-error"},
		{fmt.Errorf("secret: %w", context.Canceled), 0, ""},
	} {
		rec := httptest.NewRecorder()
		rec.Code = 0
		Database(rec, httptest.NewRequest(http.MethodGet, "/x", nil), tc.err)
		if rec.Code != tc.status {
			t.Errorf("%v: status %d, want %d", tc.err, rec.Code, tc.status)
		}
		if tc.slug != "" && !strings.Contains(rec.Body.String(), problem.TypeBase+tc.slug) {
			t.Errorf("%v: %s", tc.err, rec.Body.String())
		}
		if tc.slug == "" && rec.Body.Len() != 0 {
			t.Errorf("%v: a body for a client that went away: %s", tc.err, rec.Body.String())
		}
		if strings.Contains(rec.Body.String(), "secret") {
			t.Errorf("%v: the body carries the error's text: %s", tc.err, rec.Body.String())
		}
	}
}

// TestLogLevelByClass: a canceled client is Debug, an unreachable
// database Warn, anything else Error.
func TestLogLevelByClass(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err  error
		want string
	}{
		{context.Canceled, "level=DEBUG"},
		{&pgconn.PgError{Code: "57P01"}, "level=WARN"},
		{errors.New("bug"), "level=ERROR"},
	} {
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		Log(context.Background(), log, "decision failed", tc.err)
		if !strings.Contains(buf.String(), tc.want) {
			t.Errorf("%v: logged %q, want %s", tc.err, buf.String(), tc.want)
		}
	}
}

// silentWriter fails the test when anything is written.
type silentWriter struct {
	t      *testing.T
	header http.Header
}

func (w *silentWriter) Header() http.Header { return w.header }
func (w *silentWriter) Write(b []byte) (int, error) {
	w.t.Errorf("wrote %q to a client that went away", b)
	return len(b), nil
}
func (w *silentWriter) WriteHeader(code int) {
	w.t.Errorf("wrote status %d to a client that went away", code)
}

// TestCanceledRequestIsNotAServerError: a request whose client went away
// (its context canceled) is answered with nothing, whatever the error says
// (pgx may close a connection to interrupt a statement), and logged at
// debug level as such; a request whose context only reached its deadline
// still gets its 503.
func TestCanceledRequestIsNotAServerError(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	gone := httptest.NewRequest(http.MethodGet, "/x", nil).WithContext(ctx)
	for _, err := range []error{
		context.Canceled,
		fmt.Errorf("signin: read throttle: %w", context.Canceled),
		errors.New("conn closed"),
		&pgconn.PgError{Code: "23505", Message: "duplicate"},
	} {
		w := &silentWriter{t: t, header: http.Header{}}
		Database(w, gone, err)
		Error(w, gone, err, "sign-in-unavailable", "x")
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
		Log(gone.Context(), log, "claim failed", err)
		if !strings.Contains(buf.String(), "level=DEBUG") || !strings.Contains(buf.String(), "client went away") {
			t.Errorf("%v: logged %q, want a debug line saying the client went away", err, buf.String())
		}
	}
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	rec := httptest.NewRecorder()
	Database(rec, httptest.NewRequest(http.MethodGet, "/x", nil).WithContext(dctx), context.DeadlineExceeded)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a request at its deadline: %d, want 503", rec.Code)
	}
}

// TestUnavailableAndBadRequest: a 503 carries its slug and a Retry-After
// of 5 seconds (the database comes back); a 400 carries its slug and
// title and no Retry-After.
func TestUnavailableAndBadRequest(t *testing.T) {
	t.Parallel()
	req := httptest.NewRequest(http.MethodGet, "/x", nil)
	rec := httptest.NewRecorder()
	Unavailable(rec, req, "database-unavailable", "The database cannot be reached.")
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), problem.TypeBase+"database-unavailable") || rec.Header().Get("Retry-After") != "5" {
		t.Errorf("Unavailable: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
	rec = httptest.NewRecorder()
	BadRequest(rec, "invalid-request", "Invalid request", "No password.")
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), `"type":"`+problem.TypeBase+`invalid-request","title":"Invalid request"`) || rec.Header().Get("Retry-After") != "" {
		t.Errorf("BadRequest: %d %v %s", rec.Code, rec.Header(), rec.Body)
	}
}
