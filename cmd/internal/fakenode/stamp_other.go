//go:build !linux

package fakenode

import (
	"net"
	"syscall"
	"time"
)

// enableStamps does nothing: only Linux stamps here.
func enableStamps(_, _ string, _ syscall.RawConn) error { return nil }

// newStampConn reads tc as it is: the first byte's read is stamped by the
// clock.
func newStampConn(tc *net.TCPConn) *stampConn {
	return &stampConn{TCPConn: tc, fresh: true, recv: func(p []byte) (int, time.Time, bool, error) {
		n, err := tc.Read(p)
		return n, time.Time{}, false, err
	}}
}
