package problem

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgconn"
)

// TestWrite pins the body and headers of a refusal: the standard members,
// the extensions at the top level (never overriding a standard member),
// Retry-After in whole seconds rounded up, and the extra headers.
func TestWrite(t *testing.T) {
	t.Parallel()
	rec := httptest.NewRecorder()
	Write(rec, &Details{
		Slug: "too-many-uploads", Title: "Too many uploads", Status: http.StatusTooManyRequests,
		Detail: "five an hour", Instance: "/api/plugins", RetryAfter: 1500 * time.Millisecond,
		Extensions: map[string]any{"limit": 5, "retryAfter": 2, "status": 200, "type": "x"},
		Header:     http.Header{"Ratelimit-Policy": {`"uploads";q=5;w=3600`}},
	})
	if rec.Code != http.StatusTooManyRequests {
		t.Fatalf("status %d", rec.Code)
	}
	for h, want := range map[string]string{
		"Content-Type": "application/problem+json", "Retry-After": "2", "Cache-Control": "no-store",
		"Ratelimit-Policy": `"uploads";q=5;w=3600`,
	} {
		if got := rec.Header().Get(h); got != want {
			t.Errorf("%s: %q, want %q", h, got, want)
		}
	}
	var got map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"type": "urn:pglimit:problem:too-many-uploads", "title": "Too many uploads", "status": float64(429),
		"detail": "five an hour", "instance": "/api/plugins", "limit": float64(5), "retryAfter": float64(2),
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("body (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(rec.Body.String(), `{"type":`) {
		t.Errorf("the type member is not first: %s", rec.Body.String())
	}
}

// TestRetryAfterSeconds rounds up and never says 0.
func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for d, want := range map[time.Duration]int{0: 1, -time.Second: 1, time.Millisecond: 1, time.Second: 1, 1001 * time.Millisecond: 2, time.Minute: 60} {
		if got := RetryAfterSeconds(d); got != want {
			t.Errorf("RetryAfterSeconds(%v) = %d, want %d", d, got, want)
		}
	}
}

// TestDatabaseNeverLeaksErrorText answers an unreachable database with a
// 503 and anything else with a 500, neither carrying the error's text.
func TestDatabaseNeverLeaksErrorText(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		err    error
		status int
		slug   string
	}{
		{&pgconn.PgError{Code: "57P01", Message: "secret-shutdown-text"}, http.StatusServiceUnavailable, "database-unavailable"},
		{errors.New("conn closed secret-text"), http.StatusServiceUnavailable, "database-unavailable"},
		{&pgconn.PgError{Code: "23505", Message: "secret-constraint-text"}, http.StatusInternalServerError, "internal-error"},
		{errors.New("secret-internal-text"), http.StatusInternalServerError, "internal-error"},
	} {
		rec := httptest.NewRecorder()
		Database(rec, httptest.NewRequest(http.MethodGet, "/x", nil), tc.err)
		if rec.Code != tc.status || !strings.Contains(rec.Body.String(), TypeBase+tc.slug) {
			t.Errorf("%v: %d %s", tc.err, rec.Code, rec.Body.String())
		}
		if strings.Contains(rec.Body.String(), "secret") {
			t.Errorf("%v: the body carries the error's text: %s", tc.err, rec.Body.String())
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
// (its context canceled) is answered with nothing by Database, Internal and
// Unavailable, whatever the error says; a request whose context only
// reached its deadline still gets its 503.
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
		Internal(w, gone, err)
		Unavailable(w, gone, "sign-in-unavailable", "x", err)
	}
	dctx, dcancel := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer dcancel()
	rec := httptest.NewRecorder()
	Database(rec, httptest.NewRequest(http.MethodGet, "/x", nil).WithContext(dctx), context.DeadlineExceeded)
	if rec.Code != http.StatusServiceUnavailable {
		t.Errorf("a request at its deadline: %d, want 503", rec.Code)
	}
}
