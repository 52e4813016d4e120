package bus_test

import (
	"context"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglimit/pglimit/db"
	"github.com/pglimit/pglimit/internal/bus"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// TestForgedAndReplayedAreDropped: a role with no grant on the schema
// pglimit (a database user of the host's, as the reference service's
// console role) listens on the channel, sends notifications of its own
// (in the old unsigned form, and in the new form with a made-up tag) and
// sends the real invalidations it heard again (as they were, and with the
// key changed); the subscriber hears only the real ones, each once. The
// intruder cannot read the key.
func TestForgedAndReplayedAreDropped(t *testing.T) {
	t.Parallel()
	url, intruderURL := pgtest.WithIntruder(t)
	pool := pgtest.Pool(t, url, 2)
	pgtest.Listen(t, pool)
	b := bus.For(pool)
	var (
		mu   sync.Mutex
		keys []string
		all  int
	)
	arrived := make(chan string, 64)
	sub := b.Subscribe("rate/api", func(k string) {
		mu.Lock()
		keys = append(keys, k)
		mu.Unlock()
		arrived <- k
	}, func() {
		mu.Lock()
		all++
		mu.Unlock()
		arrived <- "*"
	})
	defer sub.Close()
	ctx := context.Background()
	intruder, err := pgx.Connect(ctx, intruderURL)
	if err != nil {
		t.Fatal(err)
	}
	defer intruder.Close(ctx)
	if _, err := intruder.Exec(ctx, "LISTEN pglimit"); err != nil {
		t.Fatal(err)
	}
	if _, err := intruder.Exec(ctx, "SELECT key FROM pglimit.bus_key"); err == nil || !strings.Contains(err.Error(), "42501") {
		t.Fatalf("the intruder read the bus's key: %v", err)
	}
	q := db.New()
	wait := func(want string) {
		t.Helper()
		select {
		case k := <-arrived:
			if k != want {
				t.Fatalf("heard %q, want %q", k, want)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("%q not heard within 20 s", want)
		}
	}
	if err := q.BusNotify(ctx, pool, "rate/api\nreal-1"); err != nil {
		t.Fatal(err)
	}
	wait("real-1")
	// What the intruder heard: the real one (and the bus's pings).
	var captured []string
	for deadline := time.Now().Add(20 * time.Second); ; {
		wctx, cancel := context.WithDeadline(ctx, deadline)
		n, err := intruder.WaitForNotification(wctx)
		cancel()
		if err != nil {
			t.Fatalf("the intruder heard nothing of real-1: %v", err)
		}
		captured = append(captured, n.Payload)
		if n.Payload == "rate/api\nreal-1" || strings.HasSuffix(n.Payload, "\nrate/api\nreal-1") {
			break
		}
	}
	real1 := captured[len(captured)-1]
	forged := []string{
		"rate/api\nforged",
		"rate/api",
		"1 " + strings.Repeat("9", 16) + " " + strings.Repeat("ab", 32) + "\nrate/api\nforged",
		real1,
		strings.Replace(real1, "real-1", "tampered", 1),
		strings.Replace(real1, "\nrate/api\nreal-1", "\nrate/api", 1),
	}
	forged = append(forged, captured...) // pings among them
	for _, p := range forged {
		if _, err := intruder.Exec(ctx, "SELECT pg_notify('pglimit', $1)", p); err != nil {
			t.Fatal(err)
		}
	}
	// Delivered in commit order: once real-2 is heard, everything the
	// intruder sent before it has been judged.
	if err := q.BusNotify(ctx, pool, "rate/api\nreal-2"); err != nil {
		t.Fatal(err)
	}
	wait("real-2")
	if err := q.BusNotify(ctx, pool, "rate/api"); err != nil {
		t.Fatal(err)
	}
	wait("*")
	mu.Lock()
	defer mu.Unlock()
	if len(keys) != 2 || keys[0] != "real-1" || keys[1] != "real-2" || all != 1 {
		t.Fatalf("heard keys %q and %d whole-topic invalidations; want real-1, real-2 and 1", keys, all)
	}
	if !b.Live() {
		t.Fatal("the bus is not Live")
	}
}

// TestSilentDropIsNotLive: a connection that stops carrying anything
// without closing (a proxy between the bus and PostgreSQL stops
// forwarding, as a peer that vanished or a dropped route) turns the bus
// not Live within 10 s (a ping unanswered within PingWait, after at most
// PingEvery of silence), and it is Live again, in a new epoch, once the
// proxy forwards again.
func TestSilentDropIsNotLive(t *testing.T) {
	t.Parallel()
	u := pgtest.URL(t)
	p := newStallProxy(t, u)
	pool := pgtest.Pool(t, p.url, 2)
	pgtest.Listen(t, pool)
	b := bus.For(pool)
	epoch := b.Epoch()
	p.stall()
	stalled := time.Now()
	for b.Live() {
		if time.Since(stalled) > 10*time.Second {
			t.Fatal("the bus is still Live 10 s after its connection went silent")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("not Live %v after the connection went silent", time.Since(stalled).Round(time.Millisecond))
	p.heal()
	healed := time.Now()
	for !b.Live() {
		if time.Since(healed) > time.Minute {
			t.Fatal("the bus did not come back within a minute of the proxy forwarding again")
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Logf("Live again %v after the proxy healed", time.Since(healed).Round(time.Millisecond))
	if b.Epoch() < epoch+2 {
		t.Fatalf("epoch %d after a silent drop, want at least %d (down, then up)", b.Epoch(), epoch+2)
	}
}

// stallProxy forwards TCP to PostgreSQL until stalled: then it holds what
// it reads, in both directions and on new connections, without closing
// anything, until healed.
type stallProxy struct {
	url     string
	mu      sync.Mutex
	cond    *sync.Cond
	stalled bool
	closed  bool
	conns   []net.Conn
}

func newStallProxy(t *testing.T, target string) *stallProxy {
	t.Helper()
	parsed, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	upstream := parsed.Host
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	parsed.Host = ln.Addr().String()
	p := &stallProxy{url: parsed.String()}
	p.cond = sync.NewCond(&p.mu)
	var wg sync.WaitGroup
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		p.closed, p.stalled = true, false
		p.cond.Broadcast()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		wg.Wait()
	})
	wg.Go(func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", upstream)
			if err != nil {
				_ = client.Close()
				continue
			}
			p.mu.Lock()
			if p.closed {
				p.mu.Unlock()
				_ = client.Close()
				_ = server.Close()
				return
			}
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			wg.Go(func() { p.pipe(server, client) })
			wg.Go(func() { p.pipe(client, server) })
		}
	})
	return p
}

func (p *stallProxy) pipe(dst, src net.Conn) {
	defer dst.Close()
	defer src.Close()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			for p.stalled {
				p.cond.Wait()
			}
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			if _, err := dst.Write(buf[:n]); err != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *stallProxy) stall() { p.mu.Lock(); p.stalled = true; p.mu.Unlock() }
func (p *stallProxy) heal() {
	p.mu.Lock()
	p.stalled = false
	p.cond.Broadcast()
	p.mu.Unlock()
}
