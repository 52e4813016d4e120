package dberr

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// TestClassification pins which errors are a timeout, an unreachable
// database, or a recovery conflict.
func TestClassification(t *testing.T) {
	t.Parallel()
	pg := func(code, msg string) error {
		return fmt.Errorf("query: %w", &pgconn.PgError{Code: code, Message: msg})
	}
	for _, tc := range []struct {
		name                           string
		err                            error
		timeout, unavailable, conflict bool
	}{
		{"nil", nil, false, false, false},
		{"deadline", context.DeadlineExceeded, true, true, false},
		{"statement timeout", pg("57014", "canceling statement due to statement timeout"), true, false, false},
		{"admin shutdown", pg("57P01", "terminating connection due to administrator command"), false, true, false},
		{"cannot connect now", pg("57P03", "the database system is starting up"), false, true, false},
		{"connection failure", pg("08006", "connection failure"), false, true, false},
		{"too many connections", pg("53300", "too many connections"), false, true, false},
		{"syntax error", pg("42601", "syntax error"), false, false, false},
		{"unique violation", pg("23505", "duplicate key"), false, false, false},
		{"serialization failure", pg("40001", "could not serialize access"), false, true, false},
		{"deadlock", pg("40P01", "deadlock detected"), false, true, false},
		{"deadlock conflict with recovery", pg("40P01", "canceling statement due to conflict with recovery"), false, true, true},
		{"read-only primary", pg("25006", "cannot execute UPDATE in a read-only transaction"), false, true, false},
		{"crash shutdown", pg("57P02", "terminating connection because of crash of another server process"), false, true, false},
		{"idle session timeout", pg("57P05", "terminating connection due to idle-session timeout"), false, true, false},
		{"connection does not exist", pg("08003", "connection does not exist"), false, true, false},
		{"integrity constraint", pg("23514", "check violation"), false, false, false},
		{"other transaction rollback", pg("40002", "integrity constraint violation"), false, false, false},
		{"invalid transaction state", pg("25001", "active sql transaction"), false, false, false},
		{"recovery conflict", pg("40001", "canceling statement due to conflict with recovery"), false, true, true},
		{"closed conn", errors.New("conn closed"), false, true, false},
		{"plain", errors.New("something else"), false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := IsTimeout(tc.err); got != tc.timeout {
				t.Errorf("IsTimeout = %v", got)
			}
			if got := IsUnavailable(tc.err); got != tc.unavailable {
				t.Errorf("IsUnavailable = %v", got)
			}
			if got := IsRecoveryConflict(tc.err); got != tc.conflict {
				t.Errorf("IsRecoveryConflict = %v", got)
			}
		})
	}
}

// TestIsCanceled: work fails as canceled only when its caller's context was
// canceled, whatever the error; a deadline is a timeout, not a cancel.
func TestIsCanceled(t *testing.T) {
	t.Parallel()
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	late, cancel2 := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancel2()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"canceled, context error", canceled, context.Canceled, true},
		{"canceled, connection closed by pgx", canceled, errors.New("conn closed"), true},
		{"canceled, no error", canceled, nil, false},
		{"live context, canceled error", context.Background(), context.Canceled, false},
		{"deadline", late, context.DeadlineExceeded, false},
	} {
		if got := IsCanceled(tc.ctx, tc.err); got != tc.want {
			t.Errorf("%s: IsCanceled = %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestOwnTimeout: an error is marked as the limiter's own Timeout only
// when that bound, not an earlier deadline of the caller, ended the
// context.
func TestOwnTimeout(t *testing.T) {
	t.Parallel()
	ctx, cancel := WithTimeout(context.Background(), time.Millisecond)
	defer cancel()
	<-ctx.Done()
	err := OwnTimeout(ctx, fmt.Errorf("claim: %w", ctx.Err()))
	if !IsOwnTimeout(err) || !IsUnavailable(err) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("own bound: %v (own %v, unavailable %v)", err, IsOwnTimeout(err), IsUnavailable(err))
	}

	caller, cancelCaller := context.WithTimeout(context.Background(), time.Millisecond)
	defer cancelCaller()
	ctx, cancel = WithTimeout(caller, time.Hour)
	defer cancel()
	<-ctx.Done()
	if err := OwnTimeout(ctx, ctx.Err()); IsOwnTimeout(err) {
		t.Errorf("the caller's deadline was taken for the limiter's own: %v", err)
	}

	ctx, cancel = WithTimeout(context.Background(), time.Hour)
	cancel()
	if err := OwnTimeout(ctx, ctx.Err()); IsOwnTimeout(err) {
		t.Errorf("a cancel was taken for the limiter's own bound: %v", err)
	}
	if OwnTimeout(ctx, nil) != nil {
		t.Error("OwnTimeout(nil) is not nil")
	}
}
