//go:build linux

package fakenode

import (
	"io"
	"net"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// enableStamps asks the kernel to stamp the segments a socket receives
// (SO_TIMESTAMPNS). Set on the listening socket, it is inherited by every
// connection accepted, and turns the kernel's stamping of received
// packets on before the first one arrives.
func enableStamps(_, _ string, c syscall.RawConn) error {
	var serr error
	if err := c.Control(func(fd uintptr) {
		serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_TIMESTAMPNS, 1)
	}); err != nil {
		return err
	}
	if serr != nil {
		return os.NewSyscallError("setsockopt SO_TIMESTAMPNS", serr)
	}
	return nil
}

// newStampConn reads tc with recvmsg, taking the kernel's stamp from the
// control message that comes with the data (SCM_TIMESTAMPNS: the stamp of
// the last segment the read took bytes from).
func newStampConn(tc *net.TCPConn) *stampConn {
	c := &stampConn{TCPConn: tc, fresh: true}
	raw, err := tc.SyscallConn()
	if err != nil {
		c.recv = func(p []byte) (int, time.Time, bool, error) {
			n, err := tc.Read(p)
			return n, time.Time{}, false, err
		}
		return c
	}
	_ = enableStamps("", "", raw) // inherited; again in case it was not
	const tsLen = int(unsafe.Sizeof(syscall.Timespec{}))
	c.recv = func(p []byte) (int, time.Time, bool, error) {
		if len(p) == 0 {
			return 0, time.Time{}, false, nil
		}
		oob := make([]byte, syscall.CmsgSpace(tsLen))
		var n, oobn int
		var rerr error
		err := raw.Read(func(fd uintptr) bool {
			for {
				n, oobn, _, _, rerr = syscall.Recvmsg(int(fd), p, oob, 0)
				if rerr != syscall.EINTR {
					return rerr != syscall.EAGAIN
				}
			}
		})
		if err != nil { // a deadline, or the connection closed
			return 0, time.Time{}, false, err
		}
		if rerr != nil {
			return 0, time.Time{}, false, &net.OpError{Op: "read", Net: "tcp", Source: tc.LocalAddr(), Addr: tc.RemoteAddr(),
				Err: os.NewSyscallError("recvmsg", rerr)}
		}
		if n == 0 {
			return 0, time.Time{}, false, io.EOF
		}
		msgs, err := syscall.ParseSocketControlMessage(oob[:oobn])
		if err != nil {
			return n, time.Time{}, false, nil
		}
		for _, m := range msgs {
			if m.Header.Level == syscall.SOL_SOCKET && m.Header.Type == syscall.SCM_TIMESTAMPNS && len(m.Data) >= tsLen {
				ts := (*syscall.Timespec)(unsafe.Pointer(&m.Data[0]))
				return n, time.Unix(ts.Unix()), true, nil
			}
		}
		return n, time.Time{}, false, nil
	}
	return c
}
