package clientaddr

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// TestKey: what the key of a request is, by its peer and headers, with
// the proxies 10.0.0.0/8 and 2001:db8:ffff::/48 trusted.
func TestKey(t *testing.T) {
	r := mustNew(t, Options{TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48"}})
	// The cases named "Forwarded …" are read by a Resolver told that the
	// proxies write Forwarded; every other by the default, X-Forwarded-For.
	rf := mustNew(t, Options{TrustedProxies: []string{"10.0.0.0/8", "2001:db8:ffff::/48"}, Header: "Forwarded"})
	hops := func(n int, client string) string {
		parts := []string{client}
		for i := 1; i < n; i++ {
			parts = append(parts, fmt.Sprintf("10.0.%d.%d", i/250, i%250+1))
		}
		return strings.Join(parts, ", ")
	}
	big := strings.Repeat("6.6.6.6, ", 64<<10/9) + "203.0.113.7"
	fwd := func(v ...string) http.Header { return http.Header{"Forwarded": v} }
	xff := func(v ...string) http.Header { return http.Header{"X-Forwarded-For": v} }
	const unreadable = "(unreadable)"
	for _, tt := range []struct {
		name string
		peer string
		h    http.Header
		want string // unreadable: ErrUnreadable
	}{
		{"no headers", "203.0.113.7:5555", nil, "203.0.113.7"},
		{"peer without a port", "203.0.113.7", nil, "203.0.113.7"},
		{"IPv6 peer by its /64", "[2001:db8:1:2:aaaa::1]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 peer, another address of the /64", "[2001:db8:1:2:bbbb:cccc:dddd:eeee]:443", nil, "2001:db8:1:2::/64"},
		{"IPv6 peer with a zone", "[fe80::1%eth0]:443", nil, "fe80::/64"},
		{"IPv4-mapped IPv6 peer", "[::ffff:203.0.113.7]:443", nil, "203.0.113.7"},

		{"untrusted peer, XFF not read", "203.0.113.7:1", xff("198.51.100.1"), "203.0.113.7"},
		{"untrusted peer, Forwarded not read", "203.0.113.7:1", fwd("for=198.51.100.1"), "203.0.113.7"},
		{"untrusted peer, forwarded chain through trusted addresses not read", "203.0.113.7:1",
			xff("198.51.100.1, 10.0.0.2, 10.0.0.3"), "203.0.113.7"},

		{"XFF from a trusted proxy", "10.0.0.1:1", xff("198.51.100.1"), "198.51.100.1"},
		{"XFF with a port", "10.0.0.1:1", xff("198.51.100.1:4711"), "198.51.100.1"},
		{"XFF, client's own entries left of the client never read", "10.0.0.1:1",
			xff("1.2.3.4, garbage, 198.51.100.1, 10.0.0.9"), "198.51.100.1"},
		{"XFF IPv6 with a zone", "10.0.0.1:1", xff("fe80::1%25eth0, fe80::2%eth0"), "fe80::/64"},
		{"XFF IPv6 bracketed with a port", "10.0.0.1:1", xff("[2001:db8:1:2::7]:4711"), "2001:db8:1:2::/64"},
		{"XFF IPv4-mapped IPv6", "10.0.0.1:1", xff("::ffff:198.51.100.1"), "198.51.100.1"},
		{"XFF IPv4-mapped IPv6 of a trusted proxy is trusted", "10.0.0.1:1", xff("198.51.100.1, ::ffff:10.0.0.5"), "198.51.100.1"},
		{"XFF through trusted IPv6 proxies", "[2001:db8:ffff::1]:1", xff("198.51.100.1, 2001:db8:ffff::2"), "198.51.100.1"},
		{"XFF empty", "10.0.0.1:1", xff(""), unreadable},
		{"XFF no lines", "10.0.0.1:1", xff(), "10.0.0.1"},
		{"XFF empty item", "10.0.0.1:1", xff("198.51.100.1,,"), unreadable},
		{"XFF duplicated lines, read as one list", "10.0.0.1:1", xff("198.51.100.1", "198.51.100.2, 10.0.0.3"), "198.51.100.2"},
		{"XFF duplicated lines, an empty last line", "10.0.0.1:1", xff("198.51.100.1", ""), unreadable},
		{"XFF garbage rightmost", "10.0.0.1:1", xff("198.51.100.1, <script>"), unreadable},
		{"XFF unspecified rightmost", "10.0.0.1:1", xff("198.51.100.1, 0.0.0.0"), unreadable},
		{"XFF only trusted addresses", "10.0.0.1:1", xff("10.0.0.2, 10.0.0.3"), unreadable},
		{"XFF 100 hops, the client rightmost", "10.0.0.1:1", xff(hops(99, "1.1.1.1") + ", 198.51.100.1"), "198.51.100.1"},
		{"XFF 100 hops, 63 trusted", "10.0.0.1:1", xff(hops(37, "1.1.1.1") + ", " + hops(63, "198.51.100.1")), "198.51.100.1"},
		{"XFF 100 hops, 99 trusted: past the hop bound", "10.0.0.1:1", xff(hops(100, "198.51.100.1")), unreadable},
		{"XFF 64 KiB, the client appended by the proxy", "10.0.0.1:1", xff(big), "203.0.113.7"},
		{"XFF 64 KiB in one item", "10.0.0.1:1", xff(strings.Repeat("9", 64<<10)), unreadable},
		{"XFF an item just over the item bound", "10.0.0.1:1", xff(strings.Repeat(" ", maxItem) + "198.51.100.1"), unreadable},

		{"Forwarded", "10.0.0.1:1", fwd("for=198.51.100.1"), "198.51.100.1"},
		{"Forwarded quoted", "10.0.0.1:1", fwd(`for="198.51.100.1"`), "198.51.100.1"},
		{"Forwarded quoted with a port", "10.0.0.1:1", fwd(`for="198.51.100.1:4711"`), "198.51.100.1"},
		{"Forwarded bracketed IPv6 with a port", "10.0.0.1:1", fwd(`for="[2001:db8:1:2::7]:4711";proto=https`), "2001:db8:1:2::/64"},
		{"Forwarded bracketed IPv6 with a zone and a port", "10.0.0.1:1", fwd(`for="[fe80::7%eth0]:4711"`), "fe80::/64"},
		{"Forwarded with other parameters", "10.0.0.1:1", fwd("by=10.0.0.1;for=198.51.100.1;host=example.com;proto=https"), "198.51.100.1"},
		{"Forwarded obfuscated node", "10.0.0.1:1", fwd("for=198.51.100.1, for=_hidden"), unreadable},
		{"Forwarded obfuscated node quoted with a port", "10.0.0.1:1", fwd(`for="_hidden:_port"`), unreadable},
		{"Forwarded unknown", "10.0.0.1:1", fwd("for=198.51.100.1, for=unknown"), unreadable},
		{"Forwarded no for", "10.0.0.1:1", fwd("proto=https;by=10.0.0.1"), unreadable},
		{"Forwarded through trusted hops", "10.0.0.1:1", fwd(`for=198.51.100.1, for=10.0.0.2;by=10.0.0.1, for="[2001:db8:ffff::9]"`), "198.51.100.1"},
		{"Forwarded duplicated lines", "10.0.0.1:1", fwd("for=198.51.100.1", "for=198.51.100.2"), "198.51.100.2"},
		{"Forwarded empty", "10.0.0.1:1", fwd(""), unreadable},
		{"Forwarded 64 KiB", "10.0.0.1:1", fwd(strings.Repeat("for=6.6.6.6;", 64<<10/12) + ", for=203.0.113.7"), "203.0.113.7"},

		{"XFF named: a Forwarded the client added never read", "10.0.0.1:1",
			http.Header{"Forwarded": {"for=1.1.1.1"}, "X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.1"},
		{"XFF named: a Forwarded alone is the proxy's own request", "10.0.0.1:1",
			http.Header{"Forwarded": {"for=1.1.1.1"}}, "10.0.0.1"},
		{"XFF named: an unreadable Forwarded never read", "10.0.0.1:1",
			http.Header{"Forwarded": {"for=unknown"}, "X-Forwarded-For": {"198.51.100.1"}}, "198.51.100.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var h Header
			if tt.h != nil {
				h = tt.h
			}
			res := r
			if strings.HasPrefix(tt.name, "Forwarded") {
				res = rf
			}
			got, err := res.Key(tt.peer, h)
			if tt.want == unreadable {
				if !errors.Is(err, ErrUnreadable) || got != "" {
					t.Fatalf("Key(%q, %.200q) = %q, %v; want ErrUnreadable", tt.peer, tt.h, got, err)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Key(%q, %.200q) = %q, %v; want %q", tt.peer, tt.h, got, err, tt.want)
			}
		})
	}
}

// TestKeyHeaderOption: only the named header (X-Forwarded-For by
// default) is read; the other never moves the key, whatever it says, and
// its absence makes the request the proxy's own.
func TestKeyHeaderOption(t *testing.T) {
	both := http.Header{"Forwarded": {"for=6.6.6.6"}, "X-Forwarded-For": {"198.51.100.1"}}
	onlyFwd := http.Header{"Forwarded": {"for=6.6.6.6"}}
	onlyXFF := http.Header{"X-Forwarded-For": {"198.51.100.1"}}
	badFwd := http.Header{"Forwarded": {"for=unknown"}, "X-Forwarded-For": {"198.51.100.1"}}
	badXFF := http.Header{"Forwarded": {"for=6.6.6.6"}, "X-Forwarded-For": {"garbage"}}
	for _, tt := range []struct {
		header string
		h      http.Header
		want   string // "": ErrUnreadable
	}{
		{"", both, "198.51.100.1"}, {"X-Forwarded-For", both, "198.51.100.1"}, {"x-forwarded-for", both, "198.51.100.1"},
		{"Forwarded", both, "6.6.6.6"}, {"FORWARDED", both, "6.6.6.6"},
		{"", onlyFwd, "10.0.0.1"}, {"Forwarded", onlyXFF, "10.0.0.1"},
		{"", badFwd, "198.51.100.1"}, {"Forwarded", badFwd, ""},
		{"", badXFF, ""}, {"Forwarded", badXFF, "6.6.6.6"},
	} {
		r := mustNew(t, Options{TrustedProxies: []string{"10.0.0.1"}, Header: tt.header})
		got, err := r.Key("10.0.0.1:1", tt.h)
		if tt.want == "" {
			if !errors.Is(err, ErrUnreadable) {
				t.Errorf("Header %q, %v: %q, %v; want ErrUnreadable", tt.header, tt.h, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Header %q, %v: %q, %v; want %q", tt.header, tt.h, got, err, tt.want)
		}
		// From a peer that is not a trusted proxy, neither header is read.
		if got, err := r.Key("203.0.113.9:1", tt.h); err != nil || got != "203.0.113.9" {
			t.Errorf("Header %q, untrusted peer: %q, %v", tt.header, got, err)
		}
	}
}

// TestKeyIPv6Prefix: the prefix an IPv6 client stands for.
func TestKeyIPv6Prefix(t *testing.T) {
	for _, tt := range []struct {
		bits int
		want string
	}{
		{0, "2001:db8:1:2::/64"}, {64, "2001:db8:1:2::/64"}, {48, "2001:db8:1::/48"},
		{56, "2001:db8:1::/56"}, {127, "2001:db8:1:2:aaaa:bbbb:cccc:dddc/127"}, {128, "2001:db8:1:2:aaaa:bbbb:cccc:dddd"},
		{1, "::/1"},
	} {
		r := mustNew(t, Options{IPv6Prefix: tt.bits})
		if got, _ := r.Key("[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:1", nil); got != tt.want {
			t.Errorf("IPv6Prefix %d: %q, want %q", tt.bits, got, tt.want)
		}
		if got, _ := r.Key("192.0.2.1:1", nil); got != "192.0.2.1" {
			t.Errorf("IPv6Prefix %d: IPv4 %q", tt.bits, got)
		}
	}
}

// TestNewBadOptions: bad options are errors at construction that name the
// value.
func TestNewBadOptions(t *testing.T) {
	for _, tt := range []struct {
		name string
		opts Options
		want string
	}{
		{"CIDR past /32", Options{TrustedProxies: []string{"10.0.0.0/8", "10.0.0.0/33"}}, `TrustedProxies[1] "10.0.0.0/33"`},
		{"CIDR past /128", Options{TrustedProxies: []string{"2001:db8::/129"}}, `"2001:db8::/129"`},
		{"not an address", Options{TrustedProxies: []string{"proxy.example.com"}}, `"proxy.example.com"`},
		{"empty", Options{TrustedProxies: []string{""}}, `TrustedProxies[0] ""`},
		{"spaces", Options{TrustedProxies: []string{" 10.0.0.1"}}, `" 10.0.0.1"`},
		{"zone", Options{TrustedProxies: []string{"fe80::1%eth0"}}, `"fe80::1%eth0"`},
		{"zone in a CIDR", Options{TrustedProxies: []string{"fe80::%eth0/64"}}, `"fe80::%eth0/64"`},
		{"prefix without bits", Options{TrustedProxies: []string{"10.0.0.0/"}}, `"10.0.0.0/"`},
		{"IPv4-mapped shorter than /96", Options{TrustedProxies: []string{"::ffff:0:0/80"}}, `"::ffff:0:0/80"`},
		{"IPv6Prefix negative", Options{IPv6Prefix: -1}, "IPv6Prefix -1"},
		{"IPv6Prefix past 128", Options{IPv6Prefix: 129}, "IPv6Prefix 129"},
		{"Header unknown", Options{Header: "X-Real-IP"}, `"X-Real-IP"`},
		{"Header both", Options{Header: "X-Forwarded-For, Forwarded"}, `"X-Forwarded-For, Forwarded"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(tt.opts)
			if err == nil || r != nil {
				t.Fatalf("New(%+v) = %v, %v; want an error", tt.opts, r, err)
			}
			if !strings.Contains(err.Error(), tt.want) || !strings.HasPrefix(err.Error(), "clientaddr: Options.") {
				t.Fatalf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

// FuzzKey: Key never panics, and its key is the peer's, or the key of an
// address that appeared in the named header (X-Forwarded-For), or it is
// ErrUnreadable, whatever the headers and the peer; never an address of
// the other header alone.
func FuzzKey(f *testing.F) {
	f.Add("10.0.0.1:1", "for=198.51.100.1", "198.51.100.1, 10.0.0.2", uint8(64))
	f.Add("[2001:db8::1]:1", `for="[2001:db8:1::1%eth0]:80", for=_x`, "::ffff:1.2.3.4", uint8(128))
	f.Add("10.0.0.1", `For="1.1.1.1, For=2.2.2.2`, ",,,", uint8(1))
	f.Add("@", "for=unknown", "[::1]:x", uint8(0))
	f.Fuzz(func(t *testing.T, peer, fwd, xff string, bits uint8) {
		r, err := New(Options{TrustedProxies: []string{"10.0.0.0/8", "2001:db8::/32", "::1"}, IPv6Prefix: int(bits%128) + 1})
		if err != nil {
			t.Fatal(err)
		}
		h := http.Header{"Forwarded": strings.Split(fwd, "\n"), "X-Forwarded-For": strings.Split(xff, "\n")}
		got, err := r.Key(peer, h)
		if errors.Is(err, ErrUnreadable) && got == "" {
			return
		}
		if err != nil {
			t.Fatalf("Key(%q, %q): error %v", peer, h, err)
		}
		if peerKey, _ := r.Key(peer, nil); got == peerKey {
			return
		}
		for _, s := range items(h.Values(headerXFF), false) {
			if a, err := netip.ParseAddr(s); err == nil && r.keyOf(a, "") == got {
				return
			}
		}
		t.Fatalf("Key(%q, %q) = %q: neither the peer's key nor one of a header's addresses", peer, h, got)
	})
}

var sink string

// BenchmarkKey: the key of a request with no trusted proxy (the peer),
// through a trusted proxy with a 3-hop X-Forwarded-For, and, as the floor
// in the same run, net.SplitHostPort + netip.ParseAddr of the peer alone.
func BenchmarkKey(b *testing.B) {
	peer := "203.0.113.7:51234"
	b.Run("baseline-splithostport-parseaddr", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			host, _, err := net.SplitHostPort(peer)
			if err != nil {
				b.Fatal(err)
			}
			a, err := netip.ParseAddr(host)
			if err != nil || !a.IsValid() {
				b.Fatal(err)
			}
			sink = host
		}
	})
	b.Run("peer", func(b *testing.B) {
		r := mustNewB(b, Options{})
		h := http.Header{"X-Forwarded-For": {"198.51.100.1"}}
		b.ReportAllocs()
		for b.Loop() {
			sink, _ = r.Key(peer, h)
		}
		if sink != "203.0.113.7" {
			b.Fatal(sink)
		}
	})
	b.Run("trusted-proxy-xff-3-hops", func(b *testing.B) {
		r := mustNewB(b, Options{TrustedProxies: []string{"10.0.0.0/8", "192.168.0.0/16"}})
		h := http.Header{"X-Forwarded-For": {"198.51.100.1, 10.1.1.1, 192.168.1.1"}}
		b.ReportAllocs()
		for b.Loop() {
			sink, _ = r.Key("10.0.0.1:51234", h)
		}
		if sink != "198.51.100.1" {
			b.Fatal(sink)
		}
	})
	b.Run("trusted-proxy-xff-ipv6", func(b *testing.B) {
		r := mustNewB(b, Options{TrustedProxies: []string{"10.0.0.0/8"}})
		h := http.Header{"X-Forwarded-For": {"2001:db8:1:2::7, 10.1.1.1, 10.2.2.2"}}
		b.ReportAllocs()
		for b.Loop() {
			sink, _ = r.Key("10.0.0.1:51234", h)
		}
		if sink != "2001:db8:1:2::/64" {
			b.Fatal(sink)
		}
	})
}

func mustNewB(b *testing.B, opts Options) *Resolver {
	r, err := New(opts)
	if err != nil {
		b.Fatal(err)
	}
	return r
}
