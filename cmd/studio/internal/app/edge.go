package app

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"

	"github.com/pglimit/pglimit/internal/netaddr"
	"github.com/pglimit/pglimit/middleware/rules"
)

// The edge: what every request but the health checks and the metrics meets
// first, before any statement. Its client address is read once (400
// client-address-unreadable when a trusted proxy's header names none); a
// body has -body-timeout to arrive; the address's deny list answers 403;
// a banned address is refused from memory.

type clientKeyKey struct{}

// clientKey is the request's client address as a key (clientaddr): the
// peer, or what a trusted proxy forwarded, as the edge read it once. A
// peer that is not an IP address (never over TCP) is one key, "unknown",
// rather than uncounted.
func (a *App) clientKey(r *http.Request) (string, bool) {
	if k, ok := r.Context().Value(clientKeyKey{}).(string); ok {
		return k, true
	}
	// A route the edge does not guard (none reads the address).
	k, err := a.addrs.Key(r.RemoteAddr, r.Header)
	if err != nil || k == "" {
		return "unknown", true
	}
	return k, true
}

// guarded puts the edge in front of h for every route but the health
// checks and the metrics: the client address read once (an unreadable
// one refused 400, counted nowhere), the body's deadline, the address's
// deny list, then its ban.
func (a *App) guarded(h http.Handler) http.Handler {
	g := a.denyByAddress.Handler(a.banGuard(h))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Every request's body has its time, the health checks' and an
		// unreadable address's included: net/http reads (up to 256 KB of)
		// a body no handler read before it answers.
		r = a.bodyDeadline(w, r)
		switch r.URL.Path {
		case "/healthz", "/readyz", "/metrics":
			h.ServeHTTP(w, r)
			return
		}
		key, err := a.addrs.Key(r.RemoteAddr, r.Header)
		if err != nil {
			a.log.DebugContext(r.Context(), "client address unreadable", "peer", r.RemoteAddr, "err", err)
			badRequest(w, "client-address-unreadable", "Client address unreadable",
				"The request came through a trusted proxy whose "+a.cfg.ClientAddressHeader+" header names no client address.")
			return
		}
		if key == "" {
			key = "unknown"
		}
		r = r.WithContext(context.WithValue(r.Context(), clientKeyKey{}, key))
		g.ServeHTTP(w, r)
	})
}

// banGuard refuses a request from a banned client address (-ban-after)
// at once, from memory, before its token is looked up or its body read:
// the address rate answers it (429 banned, no statement). An allowed
// address is exempt, as from the address rate.
//
// The address's ban holds requests without a token: a user with a token
// behind the same address (a NAT shared with an attacker) is served,
// counted under her own rate. So a request from a banned address that
// carries a token goes on when this replica has verified that token in
// the last tokenMemory, and otherwise only within a budget of token
// lookups per banned address (lookupBudget a second and lookupBurst at
// once, per replica: enough for the tokens of the users behind one NAT to
// be verified at once): a client that sends bogus tokens from a banned
// address costs the database at most that many statements a second, and
// every request past it is refused from memory, where each cost a lookup
// before.
func (a *App) banGuard(h http.Handler) http.Handler {
	if a.bans == nil || a.addrRate == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key, _ := a.clientKey(r)
		if _, banned := a.bans.Banned(r.Context(), addressBanKey(key)); !banned || rules.Allowed(r) {
			h.ServeHTTP(w, r)
			return
		}
		if token := requestToken(r); token != "" && (a.tokens.known(TokenDigest(token)) || a.lookups.allow(key)) {
			h.ServeHTTP(w, r)
			return
		}
		// The address rate refuses a banned key before anything else;
		// should the ban end in between, the request is counted in the
		// address's rate and goes on.
		a.addrRateHTTP.Handler(h).ServeHTTP(w, r)
	})
}

// requestToken is the API token a request carries: its bearer token, or
// the pages' cookie; "" for none.
func requestToken(r *http.Request) string {
	if scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " "); ok && strings.EqualFold(scheme, "Bearer") {
		return strings.TrimSpace(token)
	}
	if c, err := r.Cookie(tokenCookie); err == nil {
		return c.Value
	}
	return ""
}

// tokenMemoryFor is how long a replica remembers a token it verified, for
// banGuard alone: a request from a banned address with a token verified
// this recently goes on to its lookup without spending the address's
// budget. (Remembering is not accepting: the request is looked up as any
// other.)
const tokenMemoryFor = time.Minute

// tokenMemoryMax bounds the tokens remembered (about 100 bytes each).
const tokenMemoryMax = 10_000

// tokenMemory is the digests of the tokens this replica verified lately.
type tokenMemory struct {
	mu    sync.Mutex
	until map[string]time.Time
	swept time.Time // the last sweep of lapsed entries
}

func (m *tokenMemory) remember(digest []byte) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.until == nil {
		m.until = map[string]time.Time{}
	}
	now := time.Now()
	if _, ok := m.until[string(digest)]; !ok && len(m.until) >= tokenMemoryMax {
		// Full: lapsed entries go, at most once a second; when none has
		// lapsed, the token is not remembered (its next request from a
		// banned address spends the budget), so a flood of new tokens
		// costs a sweep a second, not one per lookup.
		if now.Sub(m.swept) < time.Second {
			return
		}
		m.swept = now
		for k, t := range m.until {
			if now.After(t) {
				delete(m.until, k)
			}
		}
		if len(m.until) >= tokenMemoryMax {
			return
		}
	}
	m.until[string(digest)] = now.Add(tokenMemoryFor)
}

func (m *tokenMemory) known(digest []byte) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.until[string(digest)]
	return ok && time.Now().Before(t)
}

// lookupBudget is the token lookups a second a banned address may cause
// on one replica for tokens it has not verified lately, and lookupBurst
// how many at once.
const (
	lookupBudget = 50
	lookupBurst  = 100
)

// lookupBudgets are the banned addresses' budgets of token lookups.
type lookupBudgets struct {
	mu sync.Mutex
	by map[string]*rate.Limiter
}

// allow spends one lookup of key's budget, reporting whether there was
// one.
func (b *lookupBudgets) allow(key string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.by == nil || len(b.by) >= tokenMemoryMax {
		b.by = map[string]*rate.Limiter{} // a ban's budget starts over; bounded either way
	}
	l, ok := b.by[key]
	if !ok {
		l = rate.NewLimiter(lookupBudget, lookupBurst)
		b.by[key] = l
	}
	return l.Allow()
}

// bodyDeadline gives r's body -body-timeout to arrive: the connection's
// read deadline is set that far ahead and cleared once the body has been read
// to its end, so that a handler that outlives the deadline (a console
// statement, an export) is not cut by it. A body still arriving at the
// deadline fails its handler's read and its connection is closed: a client
// that trickles a body a byte at a time holds a connection, a goroutine
// and its buffers no longer than this.
// It returns r with its body wrapped (a shallow copy: the incoming
// request is not changed).
func (a *App) bodyDeadline(w http.ResponseWriter, r *http.Request) *http.Request {
	if r.Body == nil || r.Body == http.NoBody {
		return r
	}
	rc := http.NewResponseController(w)
	if err := rc.SetReadDeadline(time.Now().Add(a.cfg.BodyTimeout)); err != nil {
		return r
	}
	c := r.WithContext(r.Context())
	c.Body = &deadlineBody{ReadCloser: r.Body, clear: func() { _ = rc.SetReadDeadline(time.Time{}) }}
	return c
}

// deadlineBody clears the read deadline once its body is read to the end.
type deadlineBody struct {
	io.ReadCloser
	clear func()
	once  sync.Once
}

func (b *deadlineBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.once.Do(b.clear)
	}
	return n, err
}

// Listener bounds the open connections of each peer address on ln to
// -max-conns-per-peer (an IPv6 peer by its -ipv6-prefix, as the address
// limits key it); a connection past the bound is closed as soon as it is
// accepted. Peers inside -trusted-proxies are not bounded: behind a proxy
// every client shares its address, and bounding connections per client is
// the proxy's job (nginx's limit_conn). The limits count requests; this is
// what keeps one address from holding every file descriptor of the
// process with connections that never send a request.
func (a *App) Listener(ln net.Listener) net.Listener {
	var trusted []netip.Prefix
	for _, s := range a.cfg.TrustedProxies {
		if p, err := netaddr.ParsePrefix(s); err == nil {
			trusted = append(trusted, p)
		}
	}
	return &peerListener{Listener: ln, app: a, max: int64(a.cfg.MaxConnsPerPeer), trusted: trusted, open: map[string]int64{}}
}

// peerListener is Listener's net.Listener.
type peerListener struct {
	net.Listener
	app     *App
	max     int64
	trusted []netip.Prefix

	mu   sync.Mutex
	open map[string]int64 // peer key → open connections
	// refused counts the connections closed past the bound.
	refused atomic.Int64
}

// Accept returns the next connection whose peer is under its bound,
// closing those that are not.
func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, bounded := l.peerKey(c.RemoteAddr())
		if !bounded {
			return c, nil
		}
		l.mu.Lock()
		if l.open[key] >= l.max {
			l.mu.Unlock()
			if n := l.refused.Add(1); n&(n-1) == 0 {
				// Logged at 1, 2, 4, 8, … refusals: a flood is one line per
				// doubling, not one per connection.
				l.app.log.Warn("connection refused: too many open from one peer", "peer", key,
					"max_conns_per_peer", l.max, "refused_so_far", n)
			}
			_ = c.Close()
			continue
		}
		l.open[key]++
		l.mu.Unlock()
		return &peerConn{Conn: c, release: func() { l.release(key) }}, nil
	}
}

// peerKey is the key the bound counts a peer by, and false for a peer the
// bound does not apply to (a trusted proxy, or not an IP address).
func (l *peerListener) peerKey(addr net.Addr) (string, bool) {
	if addr == nil {
		return "", false
	}
	ap, err := netip.ParseAddrPort(addr.String())
	if err != nil {
		return "", false
	}
	ip := ap.Addr().Unmap()
	for _, p := range l.trusted {
		if p.Contains(ip) {
			return "", false
		}
	}
	key, err := l.app.addrs.Key(addr.String(), nil)
	return key, err == nil && key != ""
}

func (l *peerListener) release(key string) {
	l.mu.Lock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
	l.mu.Unlock()
}

// peerConn gives its peer's place back once, when it closes.
type peerConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *peerConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// CloseWrite half-closes the connection when the wrapped one can, as
// net/http does before it closes a connection it answered with an error
// (a 431 for headers too large): the client reads that answer before the
// connection is reset.
func (c *peerConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}
