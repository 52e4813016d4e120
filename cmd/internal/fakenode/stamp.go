package fakenode

import (
	"context"
	"net"
	"runtime"
	"sync"
	"time"
)

// A call is stamped with the time its first byte reached the node: the
// kernel's receive time of that byte's segment, not the time the node's
// handler got to run. A node starved of CPU (a loaded machine, a stopped
// process) handles the calls that arrived meanwhile all at once when it
// runs again; stamped by its own clock they would look bunched, which they
// were not. The kernel stamps every segment as it arrives, whatever the
// process is doing (SO_TIMESTAMPNS; on loopback, within the sender's
// write), and a connection of Listen reads each request's first byte alone
// and keeps the stamp that came with it. (Segments that arrive while
// earlier ones are unread are merged, and the merged one carries the
// latest stamp: a request whose sender paused between its segments is
// stamped with the time of its last segment read with the first byte, no
// earlier than the request began.)

// Listen listens on the TCP address addr for the node's calls, stamped by
// the kernel (on Linux; elsewhere the handler's clock stamps them). Serve
// it with an http.Server whose ConnContext is ConnContext.
func Listen(addr string) (net.Listener, error) {
	var lc net.ListenConfig
	lc.Control = enableStamps
	ln, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	awaitStamps(ln)
	return &stampListener{Listener: ln}, nil
}

// awaitStamps waits, at most two seconds, until the kernel stamps what ln
// receives: the kernel turns its stamping of received packets on a moment
// after the first socket asks for it (later, from a work queue), and a
// call that arrived before would have no stamp. It sends itself a byte
// through ln until it comes back stamped.
func awaitStamps(ln net.Listener) {
	if runtime.GOOS != "linux" {
		return
	}
	for deadline := time.Now().Add(2 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if probeStamp(ln) {
			return
		}
	}
}

// probeStamp sends one byte to ln and reports whether the kernel stamped
// it.
func probeStamp(ln net.Listener) bool {
	c, err := net.DialTimeout("tcp", ln.Addr().String(), time.Second)
	if err != nil {
		return false
	}
	defer c.Close()
	if _, err := c.Write([]byte{0}); err != nil {
		return false
	}
	a, err := ln.Accept()
	if err != nil {
		return false
	}
	defer a.Close()
	tc, ok := a.(*net.TCPConn)
	if !ok {
		return false
	}
	_ = tc.SetReadDeadline(time.Now().Add(time.Second))
	_, _, stamped, err := newStampConn(tc).recv(make([]byte, 1))
	return err == nil && stamped
}

type stampListener struct{ net.Listener }

func (l *stampListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c, nil
	}
	return newStampConn(tc), nil
}

type connKey struct{}

// ConnContext is the http.Server's ConnContext that hands the stamps of a
// connection from Listen to the node's handler.
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	if sc, ok := c.(*stampConn); ok {
		return context.WithValue(ctx, connKey{}, sc)
	}
	return ctx
}

// stampConn is an accepted connection that keeps the kernel's stamp of
// the first byte of the request being served. The client sends a request
// only once it has read the answer to the one before (HTTP/1.1 without
// pipelining, as Go's client and a broker's clients do), so the first byte
// read after an answer was written begins the next request.
type stampConn struct {
	*net.TCPConn
	recv func(p []byte) (n int, at time.Time, stamped bool, err error)

	mu      sync.Mutex
	fresh   bool      // the next byte read begins a request
	at      time.Time // the stamp of the current request's first byte
	stamped bool      // at is the kernel's
}

// Read reads the first byte of a request alone, so that the stamp that
// comes with it is its segment's, and every other read as asked.
func (c *stampConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	fresh := c.fresh
	c.mu.Unlock()
	if fresh && len(p) > 1 {
		p = p[:1]
	}
	n, at, stamped, err := c.recv(p)
	if n > 0 {
		c.mu.Lock()
		// fresh again: a write began while this read waited (the server's
		// background read of a connection between its requests).
		if c.fresh {
			c.fresh = false
			if !stamped {
				at = time.Now()
			}
			c.at, c.stamped = at, stamped
		}
		c.mu.Unlock()
	}
	return n, err
}

// Write marks the next byte read as the beginning of a request.
func (c *stampConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.fresh = true
	c.mu.Unlock()
	return c.TCPConn.Write(p)
}

// received returns the stamp of the current request's first byte of the
// connection that ctx (a request's) was read from, and whether the kernel
// stamped it.
func received(ctx context.Context) (at time.Time, stamped, ok bool) {
	c, _ := ctx.Value(connKey{}).(*stampConn)
	if c == nil {
		return time.Time{}, false, false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() {
		return time.Time{}, false, false
	}
	return c.at, c.stamped, true
}
