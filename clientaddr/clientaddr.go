// Package clientaddr derives a request's client address, as a key any
// limiter can count against: the peer address by default; the address a
// trusted proxy forwarded, in the one header the operator names
// (X-Forwarded-For by default, or Forwarded, RFC 7239), when the peer is
// one of the configured trusted proxies.
//
// The rule is the rightmost one, as nginx's real_ip_header with
// real_ip_recursive and realclientip-go's rightmost trusted range
// strategy read it: reading the forwarded list from the right (the hop
// nearest this service), addresses inside the trusted set are skipped and
// the first one outside it is the client. Everything left of it was
// written by the client and is never read. With no trusted proxies the
// headers are never read and the key is the peer's.
//
// Only the named header is read; the other never changes the key, so a
// client behind a proxy that appends to X-Forwarded-For cannot choose its
// key by adding a Forwarded header of its own (the proxy passes it through
// unread). From a trusted proxy, a request without the named header is the
// proxy's own (its health checks): the key is the proxy's. A request whose
// header is there but names no usable address past the trusted hops — the
// rightmost untrusted item is not an address (`unknown`, an obfuscated
// `_node`, garbage, an empty item), the list holds trusted addresses only,
// or maxHops (64) trusted hops or more — has no client address: Key returns
// ErrUnreadable, and the caller refuses the request (400) and counts it
// nowhere. It is never keyed as the proxy, which would let one client
// spend (or be banned under) the key of everyone behind it.
//
// Addresses are normalised so that one client is one key: IPv4-mapped
// IPv6 (::ffff:192.0.2.1) becomes IPv4, zones (%eth0) and ports are
// dropped, and an IPv6 address stands for its prefix (Options.IPv6Prefix,
// /64 by default: a host that rotates through its /64 is one client). The
// key is the address ("203.0.113.7") or the prefix ("2001:db8:1:2::/64").
//
// The package imports no net/http: the peer is the transport's address
// as a string (http.Request.RemoteAddr, a gRPC peer's Addr.String()) and
// the headers anything with Values (http.Header; gRPC metadata through a
// one-line adapter).
package clientaddr

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/pglimit/pglimit/internal/netaddr"
)

// maxHops bounds the trusted hops read from the right of a forwarded list:
// a list with this many trusted hops before its client is ErrUnreadable.
// Real chains are a few proxies long, and the bound keeps the work per
// request small whatever the list.
const maxHops = 64

// maxItem bounds the length of one forwarded item: a longer one is not an
// address (the longest Forwarded form of one, quoted, bracketed, with a
// zone and a port, is well under it).
const maxItem = 256

// The header names, in the canonical form http.Header.Values expects.
const (
	headerForwarded = "Forwarded"
	headerXFF       = "X-Forwarded-For"
)

// Header is the request's header fields: http.Header satisfies it, and
// gRPC metadata through a method Values(k) returning metadata.MD.Get(k).
type Header interface {
	// Values returns every value of the named field, in the order they
	// came (the names asked are Forwarded and X-Forwarded-For).
	Values(key string) []string
}

// Options configure a Resolver; every field has a default.
type Options struct {
	// TrustedProxies are the proxies whose forwarded headers are believed:
	// CIDRs ("10.0.0.0/8", "2001:db8::/32") or single addresses. A peer
	// inside one of them has its headers read; the client is the rightmost
	// forwarded address outside all of them. Too few, and every client
	// behind an untrusted balancer is the balancer's one key; too many,
	// and a client inside them chooses its own key. Default none: the
	// headers are never read and the key is the peer's.
	TrustedProxies []string
	// IPv6Prefix is the length of the prefix an IPv6 client address
	// stands for, 1 to 128 (128: each address is its own client).
	// Default 64.
	IPv6Prefix int
	// Header names the one header the trusted proxies write,
	// "X-Forwarded-For" or "Forwarded" (any case); the other is never read.
	// Default "X-Forwarded-For".
	Header string
}

// Resolver derives client address keys. It is safe for concurrent use.
type Resolver struct {
	trusted []netip.Prefix
	v6bits  int
	header  string
}

// New returns a Resolver for opts, checked once, here: an entry of
// TrustedProxies that is not an address or CIDR, an IPv6Prefix outside 1
// to 128 or an unknown Header is an error naming the value.
func New(opts Options) (*Resolver, error) {
	r := &Resolver{v6bits: opts.IPv6Prefix, header: headerXFF}
	if r.v6bits == 0 {
		r.v6bits = 64
	}
	if r.v6bits < 1 || r.v6bits > 128 {
		return nil, fmt.Errorf("clientaddr: Options.IPv6Prefix %d: want 1 to 128", opts.IPv6Prefix)
	}
	switch strings.ToLower(opts.Header) {
	case "", "x-forwarded-for":
	case "forwarded":
		r.header = headerForwarded
	default:
		return nil, fmt.Errorf("clientaddr: Options.Header %q: want X-Forwarded-For or Forwarded", opts.Header)
	}
	for i, s := range opts.TrustedProxies {
		// A CIDR (host bits dropped) or a single address; IPv4-mapped
		// IPv6 is IPv4, as the addresses it is matched against are.
		p, err := netaddr.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("clientaddr: Options.TrustedProxies[%d] %q %w", i, s, err)
		}
		r.trusted = append(r.trusted, p)
	}
	return r, nil
}

// ErrUnreadable is the error of a request from a trusted proxy whose
// forwarded header is there but names no usable client address past the
// trusted hops. Refuse such a request (HTTP 400, gRPC InvalidArgument)
// and count it nowhere: it is neither the proxy nor any other key.
var ErrUnreadable = errors.New("clientaddr: the forwarded header names no client address past the trusted proxies")

// Key returns the key of the client behind peer, the transport's address
// ("192.0.2.1:5555", "[2001:db8::1]:443", with or without the port), given
// the request's headers h (nil: none). The key is "" (and the error nil)
// only when peer is not an IP address (a Unix socket). From a trusted
// proxy whose named header is there but unusable, the error is
// ErrUnreadable (matched by errors.Is) and the key "".
func (r *Resolver) Key(peer string, h Header) (string, error) {
	addr, ok := parseAddr(peer)
	if !ok {
		return "", nil
	}
	if h == nil || !r.isTrusted(addr) {
		return r.keyOf(addr, peer), nil
	}
	lines := h.Values(r.header)
	if len(lines) == 0 {
		// The proxy's own request (a health check): the proxy is the
		// client.
		return r.keyOf(addr, peer), nil
	}
	a, ok := r.rightmost(lines, r.header == headerForwarded)
	if !ok {
		return "", fmt.Errorf("%w (%s from %s)", ErrUnreadable, r.header, addr)
	}
	return r.keyOf(a, ""), nil
}

// rightmost walks the list the field lines make (in order, each split at
// commas) from the right: trusted addresses are skipped, the first item
// that is not one is the client if it is an address. Only the items it
// walks are parsed.
func (r *Resolver) rightmost(lines []string, forwarded bool) (netip.Addr, bool) {
	hops := 0
	for i := len(lines) - 1; i >= 0; i-- {
		line := lines[i]
		for {
			item := line
			j := strings.LastIndexByte(line, ',')
			if j >= 0 {
				item = line[j+1:]
			}
			var a netip.Addr
			var ok bool
			if forwarded {
				a, ok = parseForwardedItem(item)
			} else {
				a, ok = parseItem(item)
			}
			if !ok {
				return netip.Addr{}, false
			}
			if !r.isTrusted(a) {
				return a, true
			}
			if hops++; hops >= maxHops {
				return netip.Addr{}, false
			}
			if j < 0 {
				break
			}
			line = line[:j]
		}
	}
	return netip.Addr{}, false
}

func (r *Resolver) isTrusted(a netip.Addr) bool {
	for _, p := range r.trusted {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// keyOf is a's key: IPv4 as it is, IPv6 as its prefix of r.v6bits (the
// address alone at 128). When from, the text it was parsed from, starts
// with the key, the key is that part of it (no allocation).
func (r *Resolver) keyOf(a netip.Addr, from string) string {
	if a.Is6() && r.v6bits < 128 {
		p, _ := a.Prefix(r.v6bits) // a has no zone and v6bits is 1..127: no error
		return p.String()
	}
	var buf [46]byte
	b := a.AppendTo(buf[:0])
	if len(from) >= len(b) && from[:len(b)] == string(b) {
		return from[:len(b)]
	}
	return string(b)
}

// parseForwardedItem reads the for= parameter of one Forwarded element
// (`for=192.0.2.60;proto=http;by=203.0.113.43`): the first parameter
// named for (any case), its value trimmed and unquoted, read as parseItem
// reads an address. Like realclientip-go it splits the field at every
// comma, quoted or not, and takes a value after "for= " with a space.
func parseForwardedItem(item string) (netip.Addr, bool) {
	if len(item) > maxItem {
		return netip.Addr{}, false
	}
	var value string
	for item != "" {
		pair := item
		if j := strings.IndexByte(item, ';'); j >= 0 {
			pair, item = item[:j], item[j+1:]
		} else {
			item = ""
		}
		k, v, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || strings.Contains(v, "=") {
			continue
		}
		if strings.EqualFold(k, "for") {
			value = v
			break
		}
	}
	value = trimMatched(strings.TrimSpace(value), '"', '"')
	if value == "" {
		return netip.Addr{}, false
	}
	return parseItem(value)
}

// parseItem reads one address as forwarded lists and peers write it: with
// or without a port, IPv6 with or without brackets, with or without a
// zone. The zone is dropped, IPv4-mapped IPv6 is IPv4; the unspecified
// address (0.0.0.0, ::) is no address.
func parseItem(s string) (netip.Addr, bool) {
	if len(s) > maxItem {
		return netip.Addr{}, false
	}
	return parseAddr(strings.TrimSpace(s))
}

// parseAddr is parseItem without the trimming: the peer's form.
func parseAddr(s string) (netip.Addr, bool) {
	s = trimMatched(hostOf(s), '[', ']')
	if i := strings.LastIndexByte(s, '%'); i > 0 {
		s = s[:i]
	}
	a, err := netip.ParseAddr(s)
	if err != nil || a.IsUnspecified() {
		return netip.Addr{}, false
	}
	return a.Unmap(), true
}

// hostOf is s without its port, as net.SplitHostPort splits it, or s when
// it has none: "[h]:p" and "h:p" (h without colons) are split, anything
// else is left whole.
func hostOf(s string) string {
	if strings.HasPrefix(s, "[") {
		end := strings.IndexByte(s, ']')
		if end < 0 || end+1 == len(s) {
			return s
		}
		if rest := s[end+1:]; rest[0] == ':' && !strings.ContainsAny(rest, "[]") {
			return s[1:end]
		}
		return s
	}
	i := strings.LastIndexByte(s, ':')
	if i < 0 || strings.IndexByte(s[:i], ':') >= 0 || strings.ContainsAny(s, "[]") {
		return s
	}
	return s[:i]
}

// trimMatched removes first and last from the ends of s when both are
// there.
func trimMatched(s string, first, last byte) string {
	if len(s) >= 2 && s[0] == first && s[len(s)-1] == last {
		return s[1 : len(s)-1]
	}
	return s
}
