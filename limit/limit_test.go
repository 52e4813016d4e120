package limit_test

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

	"github.com/pglimit/pglimit"
	"github.com/pglimit/pglimit/limit"
	"github.com/pglimit/pglimit/middleware/heavy"
	"github.com/pglimit/pglimit/middleware/inflight"
	"github.com/pglimit/pglimit/middleware/signin"
	"github.com/pglimit/pglimit/middleware/upload"
)

func TestRefusalError(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		r    limit.Refusal
		want string
	}{
		{limit.Refusal{Kind: "heavy", Name: "sql-console", Scope: "installation", Limit: 4, RetryAfter: 10 * time.Second},
			"heavy: sql-console: the installation limit of 4 is reached; retry in 10s"},
		{limit.Refusal{Kind: "inflight", Name: "in-flight", Scope: "token", Limit: 8, RetryAfter: time.Second},
			"inflight: in-flight: the token limit of 8 is reached; retry in 1s"},
		{limit.Refusal{Kind: "upload", Name: "uploads", Scope: "user", Limit: 5, Window: time.Hour, RetryAfter: time.Minute},
			"upload: uploads: the user limit of 5 per 1h0m0s is reached; retry in 1m0s"},
		{limit.Refusal{Kind: "signin", Name: "sign-in", Scope: "address", Limit: 20, Window: 15 * time.Minute, RetryAfter: 14 * time.Minute},
			"signin: sign-in: the address limit of 20 per 15m0s is reached; retry in 14m0s"},
	} {
		if got := tc.r.Error(); got != tc.want {
			t.Errorf("Error() = %q, want %q", got, tc.want)
		}
	}
}

// TestRefusalMatchesErrLimited: a refusal, wrapped or not, matches
// pglimit.ErrLimited and nothing else, and errors.As finds it.
func TestRefusalMatchesErrLimited(t *testing.T) {
	t.Parallel()
	var err error = fmt.Errorf("export: %w", &limit.Refusal{Kind: "heavy", Name: "export", Scope: "user", Limit: 1})
	if !errors.Is(err, pglimit.ErrLimited) {
		t.Error("a wrapped refusal does not match pglimit.ErrLimited")
	}
	if errors.Is(err, pglimit.ErrSettled) || errors.Is(err, context.Canceled) {
		t.Error("a refusal matches another sentinel")
	}
	var r *limit.Refusal
	if !errors.As(err, &r) || r.Name != "export" {
		t.Errorf("errors.As: %+v", r)
	}
}

// TestNewPermit: a Permit's Release calls the release it was made with,
// on every call, and returns its error; one made without holds nothing and
// says its dry-run refusal.
func TestNewPermit(t *testing.T) {
	t.Parallel()
	calls, failed := 0, errors.New("release failed")
	p := limit.NewPermit(func(context.Context) error { calls++; return failed }, nil)
	if err := p.Release(context.Background()); !errors.Is(err, failed) || calls != 1 {
		t.Errorf("Release = %v after %d calls, want %v after 1", err, calls, failed)
	}
	if err := p.Release(context.Background()); !errors.Is(err, failed) || calls != 2 {
		t.Errorf("second Release = %v after %d calls, want %v after 2", err, calls, failed)
	}
	if p.Refusal() != nil {
		t.Errorf("Refusal = %v, want nil", p.Refusal())
	}
	would := &limit.Refusal{Kind: "heavy", Name: "export", Scope: "user", Limit: 1, RetryAfter: time.Second}
	dry := limit.NewPermit(nil, would)
	if err := dry.Release(context.Background()); err != nil || dry.Refusal() != would {
		t.Errorf("dry-run permit: Release = %v, Refusal = %v", err, dry.Refusal())
	}
}

// TestNilPermit: Release and Refusal are safe on a nil Permit and on the
// zero one (they hold nothing).
func TestNilPermit(t *testing.T) {
	t.Parallel()
	var p *limit.Permit
	if err := p.Release(context.Background()); err != nil {
		t.Errorf("Release of a nil Permit: %v", err)
	}
	if p.Refusal() != nil {
		t.Error("a nil Permit has a refusal")
	}
	if err := new(limit.Permit).Release(context.Background()); err != nil {
		t.Errorf("Release of a zero Permit: %v", err)
	}
}

// A refusal of any slot limiter or of the sign-in throttle says which
// limit refused, whose scope, and when to retry.
func ExampleRefusal() {
	// What a heavy endpoint's Acquire returns when the user runs its limit
	// of requests already (here made by hand).
	var err error = &limit.Refusal{Kind: "heavy", Name: "sql-console", Scope: "user", Limit: 2, RetryAfter: 30 * time.Second}

	var refused *limit.Refusal
	if errors.As(err, &refused) {
		fmt.Println(refused.Kind, refused.Name, refused.Scope, refused.Limit, refused.RetryAfter)
	}
	fmt.Println(errors.Is(err, pglimit.ErrLimited))
	// Output:
	// heavy sql-console user 2 30s
	// true
}

// TestWriteErrorAnswersItsOwnKind: each transport's WriteError answers a
// refusal of its own kind with its 429, and one of another kind (passed to
// the wrong OnError) as the server error it is, never as its own refusal.
func TestWriteErrorAnswersItsOwnKind(t *testing.T) {
	t.Parallel()
	refusals := map[string]*limit.Refusal{
		"heavy":    {Kind: "heavy", Name: "sql-console", Scope: "user", Limit: 2, RetryAfter: 30 * time.Second},
		"inflight": {Kind: "inflight", Name: "in-flight", Scope: "token", Limit: 8, RetryAfter: time.Minute},
		"upload":   {Kind: "upload", Name: "uploads", Scope: "user", Limit: 5, Window: time.Hour, RetryAfter: time.Minute},
		"signin":   {Kind: "signin", Name: "sign-in", Scope: "username", Limit: 5, Window: 15 * time.Minute, RetryAfter: time.Minute},
	}
	writers := map[string]struct {
		write func(http.ResponseWriter, *http.Request, error)
		slug  string
	}{
		"heavy":    {heavy.WriteError, "too-many-heavy-requests"},
		"inflight": {inflight.WriteError, "too-many-requests-in-flight"},
		"upload":   {upload.WriteError, "too-many-uploads"},
		"signin":   {signin.WriteError, "too-many-failed-sign-ins"},
	}
	for wk, w := range writers {
		for rk, r := range refusals {
			rec := httptest.NewRecorder()
			w.write(rec, httptest.NewRequest(http.MethodPost, "/x", nil), fmt.Errorf("wrapped: %w", r))
			var body struct{ Type string }
			_ = json.Unmarshal(rec.Body.Bytes(), &body)
			own := strings.HasSuffix(body.Type, ":"+w.slug)
			switch {
			case wk == rk && (rec.Code != http.StatusTooManyRequests || !own):
				t.Errorf("%s.WriteError of its own refusal: %d %s", wk, rec.Code, body.Type)
			case wk != rk && (rec.Code != http.StatusInternalServerError || own):
				t.Errorf("%s.WriteError of a %s refusal: %d %s, want 500", wk, rk, rec.Code, body.Type)
			}
		}
	}
}
