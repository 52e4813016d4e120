// Package bus carries pglimit's invalidations between replicas over
// PostgreSQL's LISTEN/NOTIFY, the bus the database already has.
//
// A limiter that answers refusals from memory (ratelimit, signin) keeps
// them only while it would hear a write that undoes one: an operator's
// reset, a successful sign-in that clears a username's failures, a
// reservation given back. Those writes send a notification on the channel
// "pglimit" right after the statement that makes them (BusNotify, a
// pg_notify delivered at commit), and every replica's Bus hands it to the
// caches of its topic.
//
// A Bus is one per pool (For), listens on a connection of its own (not one
// of the pool's: a pool's Close waits for its connections) while Run runs
// — pglimit.Run runs it — and is Live only while that connection is up and
// has just carried a notification of its own (a ping, sent when the bus
// has been silent for PingEvery, and heard back within PingWait, sending
// included): a connection that broke, one that went silent without
// closing (a peer or route gone: Live turns false within PingEvery +
// PingWait, 6 s, not when TCP gives up; TestSilentDropIsNotLive), a proxy
// that does not pass notifications (PgBouncer in transaction pooling)
// makes it not Live, and caches then answer nothing from memory. Each time
// it turns Live its Epoch changes, so what a cache remembered before, while
// it may have missed a notification, is not used again.
//
// # Authenticated notifications
//
// Any role that may connect to the database may NOTIFY on the channel and
// LISTEN to it. So every notification is authenticated (sql/queries/bus.sql,
// migration 00008): its payload is "<seq> <at> <tag>", a newline, then the
// message, where seq is the next number of pglimit.bus_seq, at the
// database's clock (µs), and tag the HMAC-SHA256 of both and the message
// under the 64-byte random key in pglimit.bus_key, which only pglimit's
// owner may read. The statement that sends it computes the tag, with the
// built-in sha256(), so writers hold no secret; a Bus reads the key when
// it connects. It drops a notification whose tag is wrong (a forgery:
// another role cannot make one), whose number it heard already (a replay
// of what another role overheard), or whose time is more than 30 s behind
// the latest it heard or the database's clock when it connected (a replay
// of an older one to a replica that connected since); its own ping is
// such a notification too, with a random nonce, so no other role can keep
// a dead bus Live (TestForgedAndReplayedAreDropped, TestVerifierRefuses).
// What a notification costs: on the writer, still one statement (the
// key's one-row read, a nextval and two sha256 over a few hundred bytes
// within it); on each reader, no statement (one key read per connection)
// and one HMAC. A forged one costs a reader a parse and at most one HMAC
// over at most 8,000 bytes (PostgreSQL's payload bound), and no statement,
// whatever their number. Another role still sees the topics and keys of
// the invalidations (a username whose failures were cleared, a reset
// rate-limit key), and may flood the server's notification queue, which
// delays every listener of the database: PostgreSQL has no grant for
// channels. The alternative, a notification that only says "look" and
// invalidations read from a pglimit table, would hide them at the cost of
// a statement per invalidation on every replica, and of a table to sweep.
package bus

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"weak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglimit/pglimit/db"
)

// Channel is the notification channel of every pglimit invalidation.
const Channel = "pglimit"

// Topics of the payloads: a payload is a topic, a newline and a key (a
// stored key: valid UTF-8 without NUL), or a topic alone for all its keys.
const (
	// TopicSignIn is the sign-in throttle's login_attempt.
	TopicSignIn = "signin"
	// TopicRate prefixes a rate limiter's name: "rate/" + name.
	TopicRate = "rate/"
	// TopicOverride is package override's limits as data; a key is
	// policy + "/" + key, and the whole topic reloads every override.
	TopicOverride = "override"
	// TopicAccess is the allow and deny lists' access_rule (package
	// access), sent alone: every replica reloads the lists.
	TopicAccess = "access"
	// TopicBan is package ban's pglimit.ban: a key banned (its message
	// the ban's end on the database clock, in µs since 1970, a space and
	// the key) or lifted ("-", a space and the key).
	TopicBan = "ban"
	// TopicSlots prefixes a kind of leased slots (permit.Kind): "slots/"
	// + kind. A key is "want <keeper> <scope>" (a replica was refused in
	// scope: the replicas that keep idle slots of it give them back) or
	// "gave <keeper> <scope>" (a replica gave some back), where keeper
	// names the sender's slot keeper (internal/slots, Keep).
	TopicSlots = "slots/"
	// topicPing is the bus's own liveness check.
	topicPing = "ping"
)

// Timing of the liveness check.
var (
	// PingEvery is the silence after which the bus pings itself.
	PingEvery = time.Second
	// PingWait is how long a ping may take to come back before the bus
	// stops being Live and connects again.
	PingWait = 5 * time.Second
	// retryMax bounds the wait between two connection attempts.
	retryMax = 30 * time.Second
	// connectWait bounds a connection attempt and its setup.
	connectWait = 10 * time.Second
)

// Bus is the invalidation bus of one pool. It is safe for concurrent use.
type Bus struct {
	live    atomic.Bool
	epoch   atomic.Uint64
	running atomic.Bool
	// fresh is set when a connection turned Live: the next failure
	// starts its back-off from the beginning.
	fresh atomic.Bool

	mu   sync.Mutex
	subs map[string][]*Subscription
}

// Subscription receives the invalidations of one topic.
type Subscription struct {
	b     *Bus
	topic string
	// seq counts the invalidations delivered: with the bus's epoch, a
	// cache reads it before a decision and remembers the decision only if
	// it did not move, so an invalidation that arrived while the statement
	// ran is never overwritten.
	seq    atomic.Uint64
	onKey  func(key string)
	onAll  func()
	closed atomic.Bool
}

var (
	busesMu sync.Mutex
	buses   = map[weak.Pointer[pgxpool.Pool]]*Bus{}
)

// For returns pool's Bus, made on first use and forgotten with the pool.
func For(pool *pgxpool.Pool) *Bus {
	wp := weak.Make(pool)
	busesMu.Lock()
	defer busesMu.Unlock()
	if b, ok := buses[wp]; ok {
		return b
	}
	b := &Bus{subs: map[string][]*Subscription{}}
	buses[wp] = b
	runtime.AddCleanup(pool, func(wp weak.Pointer[pgxpool.Pool]) {
		busesMu.Lock()
		delete(buses, wp)
		busesMu.Unlock()
	}, wp)
	return b
}

// Live reports whether the bus is listening and has just heard itself:
// only then may a cache answer from memory.
func (b *Bus) Live() bool { return b.live.Load() }

// Epoch changes whenever the bus turns Live (and when it stops being
// Live): a cache's entry made in another epoch is not used.
func (b *Bus) Epoch() uint64 { return b.epoch.Load() }

// Subscribe delivers topic's invalidations: onKey for one key, onAll for
// every key of the topic. Either may be nil. They run on the bus's
// goroutine: keep them short.
func (b *Bus) Subscribe(topic string, onKey func(string), onAll func()) *Subscription {
	s := &Subscription{b: b, topic: topic, onKey: onKey, onAll: onAll}
	b.mu.Lock()
	b.subs[topic] = append(b.subs[topic], s)
	b.mu.Unlock()
	return s
}

// Seq is the count of invalidations (and epoch changes) s has seen.
func (s *Subscription) Seq() uint64 { return s.seq.Load() + s.b.epoch.Load() }

// Close stops the deliveries.
func (s *Subscription) Close() {
	if s.closed.Swap(true) {
		return
	}
	b := s.b
	b.mu.Lock()
	defer b.mu.Unlock()
	list := b.subs[s.topic]
	for i, x := range list {
		if x == s {
			b.subs[s.topic] = append(list[:i:i], list[i+1:]...)
			break
		}
	}
}

// deliver hands one payload to its subscribers.
func (b *Bus) deliver(payload string) {
	topic, key, one := strings.Cut(payload, "\n")
	b.mu.Lock()
	subs := append([]*Subscription(nil), b.subs[topic]...)
	b.mu.Unlock()
	for _, s := range subs {
		s.seq.Add(1)
		switch {
		case one && s.onKey != nil:
			s.onKey(key)
		case !one && s.onAll != nil:
			s.onAll()
		case one && s.onAll != nil:
			s.onAll()
		}
	}
}

func (b *Bus) setLive(live bool) {
	if b.live.Load() == live {
		return
	}
	// Epoch first: a cache that sees the bus Live also sees the new epoch.
	b.epoch.Add(1)
	b.live.Store(live)
}

// Run listens for pool's invalidations until ctx ends, connecting again
// after a failure (at most every few seconds), and returns nil then. A
// second Run of the same pool at once waits for ctx and does nothing.
func Run(ctx context.Context, pool *pgxpool.Pool, log *slog.Logger) error {
	b := For(pool)
	if !b.running.CompareAndSwap(false, true) {
		<-ctx.Done()
		return nil
	}
	defer b.running.Store(false)
	defer b.setLive(false)
	if log == nil {
		log = slog.Default()
	}
	wait := 100 * time.Millisecond
	failing, started := false, false
	for ctx.Err() == nil {
		err := b.listen(ctx, pool)
		b.setLive(false)
		if ctx.Err() != nil {
			return nil
		}
		wasLive := b.fresh.Swap(false)
		if wasLive && !errors.Is(err, errPooled) {
			wait, failing = 100*time.Millisecond, false
		}
		switch {
		case failing:
		case (wasLive || started) && !errors.Is(err, errPooled):
			// A bus that worked and broke: a failure worth a warning.
			log.WarnContext(ctx, "pglimit: the invalidation bus (LISTEN pglimit) is down; refusals are decided in the database until it is back",
				"err", err)
		default:
			// It never worked here: most likely a proxy that does not
			// pass notifications (PgBouncer in transaction pooling). Not
			// a failure: every decision is a statement, as without it.
			log.InfoContext(ctx, "pglimit: refusals are decided in the database: the invalidation bus (LISTEN pglimit) does not answer on this connection; trying again now and then",
				"err", err)
		}
		failing = true
		started = started || wasLive
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
		wait = min(2*wait, retryMax)
	}
	return nil
}

// listen holds one connection until it fails or ctx ends.
func (b *Bus) listen(ctx context.Context, pool *pgxpool.Pool) error {
	cfg := pool.Config().ConnConfig.Copy()
	// Connecting and setting up (LISTEN, the key, the session) share one
	// bound: a connection that goes silent meanwhile fails it.
	cctx, cancel := context.WithTimeout(ctx, connectWait)
	defer cancel()
	conn, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer func() {
		// Not Live from now on, before a close that may take its time.
		b.setLive(false)
		cctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	// SQL in Go: LISTEN takes no parameters and names a channel, which
	// sqlc cannot express; the other statements are sqlc's (bus.sql).
	if _, err := conn.Exec(cctx, "LISTEN "+Channel); err != nil {
		return err
	}
	q := db.New()
	k, err := q.BusKey(cctx, conn)
	if err != nil {
		return fmt.Errorf("bus: reading pglimit.bus_key: %w", err)
	}
	v := newVerifier(k.Key, k.NowUs)
	var (
		session int32
		port    *int32
	)
	if err := conn.QueryRow(cctx, "SELECT pg_backend_pid(), inet_client_port()").Scan(&session, &port); err != nil {
		return err
	}
	if proxied(conn, port) {
		// Something stands between (the server sees another client
		// port): a pooler that hands this session to other clients
		// between transactions would hand a new connection the session
		// this one just used.
		if err := probe(cctx, cfg, session); err != nil {
			return err
		}
	}
	cancel()
	for ctx.Err() == nil {
		// The ping, sent and heard back within PingWait: a connection
		// that went silent (a peer gone without a word) fails here, not
		// when TCP gives up.
		if err := b.ping(ctx, conn, q, v, session); err != nil || ctx.Err() != nil {
			return err
		}
		if !b.Live() {
			b.fresh.Store(true)
		}
		b.setLive(true)
		// Deliver until the bus has been silent for PingEvery.
		for {
			wctx, cancel := context.WithTimeout(ctx, PingEvery)
			n, err := conn.WaitForNotification(wctx)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if errors.Is(err, context.DeadlineExceeded) && !conn.IsClosed() {
					break // silent: ping again
				}
				return err
			}
			if msg, ok := v.open(n.Payload); ok && !strings.HasPrefix(msg, topicPing+"\n") {
				b.deliver(msg)
			}
		}
	}
	return nil
}

// ping sends the bus's own notification on conn and waits for it, all
// within PingWait, delivering what arrives meanwhile. It returns nil when
// ctx ends.
func (b *Bus) ping(ctx context.Context, conn *pgx.Conn, q *db.Queries, v *verifier, session int32) error {
	pctx, cancel := context.WithTimeout(ctx, PingWait)
	defer cancel()
	nonce := topicPing + "\n" + newNonce()
	pid, err := q.BusPing(pctx, conn, nonce)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("bus: ping: %w", err)
	}
	if pid != session {
		// The connection's statements run in different server
		// sessions: a transaction pooler between (PgBouncer in
		// transaction pooling), which does not keep a LISTEN.
		return errPooled
	}
	for {
		n, err := conn.WaitForNotification(pctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return errors.New("bus: ping not heard back within " + PingWait.String())
		}
		msg, ok := v.open(n.Payload)
		switch {
		case !ok: // forged, replayed or stale: dropped
		case msg == nonce:
			return nil
		case !strings.HasPrefix(msg, topicPing+"\n"):
			b.deliver(msg)
		}
	}
}

// proxied reports whether the server saw a client port other than the
// connection's own: a proxy or pooler between (a Unix socket has none).
func proxied(conn *pgx.Conn, serverSaw *int32) bool {
	local, ok := conn.PgConn().Conn().LocalAddr().(*net.TCPAddr)
	if !ok || serverSaw == nil {
		return false
	}
	return int32(local.Port) != *serverSaw
}

// probe connects again through the same proxy and fails with errPooled if
// it is given the listening session.
func probe(ctx context.Context, cfg *pgx.ConnConfig, session int32) error {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	other, err := pgx.ConnectConfig(cctx, cfg)
	if err != nil {
		return err
	}
	defer other.Close(context.Background())
	for range 3 {
		var pid int32
		if err := other.QueryRow(cctx, "SELECT pg_backend_pid()").Scan(&pid); err != nil {
			return err
		}
		if pid == session {
			return errPooled
		}
	}
	return nil
}

// errPooled is a connection whose statements do not all run in the
// session that listens.
var errPooled = errors.New("bus: the connection's statements run in different server sessions (a transaction pooler), which do not keep a LISTEN")

func newNonce() string {
	var buf [8]byte
	_, _ = rand.Read(buf[:])
	return hex.EncodeToString(buf[:])
}
