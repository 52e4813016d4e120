package clientaddr

// The test tables of github.com/realclientip/realclientip-go v1.0.0
// (0BSD), case for case, for the parts this package shares with it: the
// peer (RemoteAddrStrategy), one address (ParseIPAddr, goodIPAddr), one
// Forwarded element (parseForwardedListItem, and its RFC deviations),
// trusted ranges (AddressesAndRangesToIPNets) and the rightmost walk
// (RightmostTrustedRangeStrategy). Where this package differs on purpose
// the case says so: zones are dropped (a key never carries one), a
// failure is the peer's key rather than "", and the headers are read only
// from a trusted peer.

import (
	"errors"
	"net/http"
	"net/netip"
	"strings"
	"testing"
)

// key is r.Key, with IPv6 addresses whole (-ipv6-prefix 128) so the
// tables compare addresses as realclientip-go does.
func mustNew(t *testing.T, opts Options) *Resolver {
	t.Helper()
	r, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func TestRealClientIPRemoteAddr(t *testing.T) {
	r := mustNew(t, Options{IPv6Prefix: 128})
	for _, tt := range []struct{ name, peer, want string }{
		{"IPv4 with port", "2.2.2.2:1234", "2.2.2.2"},
		{"IPv4 with no port", "2.2.2.2", "2.2.2.2"},
		{"IPv6 with port", "[2607:f8b0:4004:83f::18]:3838", "2607:f8b0:4004:83f::18"},
		{"IPv6 with no port", "2607:f8b0:4004:83f::18", "2607:f8b0:4004:83f::18"},
		// realclientip-go keeps the zone; a key drops it.
		{"IPv6 with zone and no port", "fe80::1111%eth0", "fe80::1111"},
		{"IPv6 with zone and port", "[fe80::2222%eth0]:4848", "fe80::2222"},
		{"IPv4-mapped IPv6", "[::ffff:172.21.0.6]:4747", "172.21.0.6"},
		{"IPv4-mapped IPv6 in IPv6 form", "0:0:0:0:0:ffff:bc15:0006", "188.21.0.6"},
		{"NAT64 IPv4-mapped IPv6", "[64:ff9b::188.0.2.128]:4747", "64:ff9b::bc00:280"},
		{"6to4 IPv4-mapped IPv6", "[2002:c000:204::]:4747", "2002:c000:204::"},
		{"IPv4 loopback", "127.0.0.1", "127.0.0.1"},
		{"IPv6 loopback", "::1", "::1"},
		{"Fail: empty RemoteAddr", "", ""},
		{"Fail: garbage RemoteAddr", "ohno", ""},
		{"Fail: zero RemoteAddr IP", "0.0.0.0", ""},
		{"Fail: unspecified RemoteAddr IP", "::", ""},
		{"Fail: Unix domain socket", "@", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := r.Key(tt.peer, nil); got != tt.want || err != nil {
				t.Fatalf("Key(%q) = %q, want %q", tt.peer, got, tt.want)
			}
		})
	}
	// Garbage header (unused): no trusted proxy, the header is not read.
	h := http.Header{"X-Forwarded-For": {"!!!"}}
	if got, err := r.Key("2.2.2.2:1234", h); got != "2.2.2.2" || err != nil {
		t.Fatalf("garbage header: %q", got)
	}
}

// TestRealClientIPParseIPAddr is ParseIPAddr's and goodIPAddr's table:
// the zero and unspecified addresses are no address (goodIPAddr), and the
// zone is dropped.
func TestRealClientIPParseIPAddr(t *testing.T) {
	for _, tt := range []struct{ name, in, want string }{
		{"Empty zone", "1.1.1.1%", "1.1.1.1"},
		{"No zone", "1.1.1.1", "1.1.1.1"},
		{"With zone", "fe80::abcd%zone", "fe80::abcd"},
		{"With zone and port", "[2607:f8b0:4004:83f::200e%zone]:4484", "2607:f8b0:4004:83f::200e"},
		{"With port", "1.1.1.1:48944", "1.1.1.1"},
		{"Bad port (is discarded)", "[fe80::abcd%eth0]:xyz", "fe80::abcd"},
		{"Error: Zero address", "0.0.0.0", ""},
		{"Error: Unspecified address", "::", ""},
		{"Error: bad IP with zone", "nope%zone", ""},
		{"Error: bad IP", "nope!!", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := addrText(parseItem(tt.in)); got != tt.want {
				t.Fatalf("parseItem(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func addrText(a netip.Addr, ok bool) string {
	if !ok {
		return ""
	}
	return a.String()
}

func TestRealClientIPForwardedListItem(t *testing.T) {
	for _, tt := range []struct{ name, fwd, want string }{
		{"IPv6 with port and quotes", `For="[2607:f8b0:4004:83f::200e]:4711"`, "2607:f8b0:4004:83f::200e"},
		{"IPv6 with quotes, brackets and no port", `fOR="[2607:f8b0:4004:83f::200e]"`, "2607:f8b0:4004:83f::200e"},
		{"IPv6 with quotes, no brackets, and no port", `for="2607:f8b0:4004:83f::200e"`, "2607:f8b0:4004:83f::200e"},
		{"IPv6 with brackets, no quotes, and no port", `FOR=[2607:f8b0:4004:83f::200e]`, "2607:f8b0:4004:83f::200e"},
		{"IPv6 with port and no quotes", `For=[2607:f8b0:4004:83f::200e]:4711`, "2607:f8b0:4004:83f::200e"},
		{"IPv6 with port, quotes, and zone", `For="[fe80::abcd%zone]:4711"`, "fe80::abcd"},
		{"IPv6 with zone, no quotes, no port", `For="fe80::abcd%zone"`, "fe80::abcd"},
		{"IPv4 with port", `FoR=192.0.2.60:4711`, "192.0.2.60"},
		{"IPv4 with no port", `for=192.0.2.60`, "192.0.2.60"},
		{"IPv4 with quotes", `for="192.0.2.60"`, "192.0.2.60"},
		{"IPv4 with port and quotes", `for="192.0.2.60:4823"`, "192.0.2.60"},
		{"Error: invalid IPv4", `for=192.0.2.999`, ""},
		{"Error: invalid IPv6", `for="2607:f8b0:4004:83f::999999"`, ""},
		{"Error: non-IP identifier", `for="_test"`, ""},
		{"Error: empty IP value", `for=`, ""},
		{"Multiple IPv4 directives", `by=1.1.1.1; for=2.2.2.2;host=myhost; proto=https`, "2.2.2.2"},
		{"Multiple IPv6 directives", `by=1::1;host=myhost;for=2::2;proto=https`, "2::2"},
		{"Multiple mixed directives", `by=1::1;host=myhost;proto=https;for=2.2.2.2`, "2.2.2.2"},
		{"IPv4-mapped IPv6", `for="[::ffff:188.0.2.128]"`, "188.0.2.128"},
		{"IPv4-mapped IPv6 with port and quotes", `for="[::ffff:188.0.2.128]:49428"`, "188.0.2.128"},
		{"IPv4-mapped IPv6 in IPv6 form", `for="[0:0:0:0:0:ffff:bc15:0006]"`, "188.21.0.6"},
		{"NAT64 IPv4-mapped IPv6", `for="[64:ff9b::188.0.2.128]"`, "64:ff9b::bc00:280"},
		{"IPv4 loopback", `for=127.0.0.1`, "127.0.0.1"},
		{"IPv6 loopback", `for="[::1]"`, "::1"},
		{"Error: Unmatched quote", `for="1.1.1.1`, ""},
		{"Error: IPv6 loopback", `for="::1]"`, ""},
		{"Error: misplaced quote", `for="[0:0:0:0:0:ffff:bc15:0006"]`, ""},
		{"Error: garbage", "ads\x00jkl&#*(383fdljk", ""},
		{"RFC deviation: quoted pair", `for=1.1.1.\1`, ""},
		{"RFC deviation: Incorrect whitespace", `for= 1.1.1.1`, "1.1.1.1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if got := addrText(parseForwardedItem(tt.fwd)); got != tt.want {
				t.Fatalf("parseForwardedItem(%q) = %q, want %q", tt.fwd, got, tt.want)
			}
		})
	}
}

// items parses every item of a field's lines, as rightmost walks them
// (from the right), returned left to right; "" for an item that is no
// address.
func items(lines []string, forwarded bool) []string {
	var out []string
	for i := len(lines) - 1; i >= 0; i-- {
		parts := strings.Split(lines[i], ",")
		for j := len(parts) - 1; j >= 0; j-- {
			if forwarded {
				out = append(out, addrText(parseForwardedItem(parts[j])))
			} else {
				out = append(out, addrText(parseItem(parts[j])))
			}
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	return out
}

// TestRealClientIPForwardedDeviations: realclientip-go's deviations from
// the Forwarded syntax of RFC 7239, which this package shares; the walk
// over each list is checked with the trusted set that makes it read every
// item.
func TestRealClientIPForwardedDeviations(t *testing.T) {
	for _, tt := range []struct {
		name string
		fwd  string
		want []string
	}{
		{"Comma in quotes", `For="1.1.1.1, For=2.2.2.2, For=3.3.3.3", For="4.4.4.4"`, []string{"", "2.2.2.2", "", "4.4.4.4"}},
		{"Unmatched quote", `For="1.1.1.1, For=2.2.2.2`, []string{"", "2.2.2.2"}},
		{"Invalid characters", `For=1.1.1.1;@!=😀, For=2.2.2.2`, []string{"1.1.1.1", "2.2.2.2"}},
		{"Duplicate token", `For=1.1.1.1;For=2.2.2.2, For=3.3.3.3`, []string{"1.1.1.1", "3.3.3.3"}},
		{"Escaped character", `For="3.3.3.\3"`, []string{""}},
		{"Equal sign spaces", `For =1.1.1.1, For= 3.3.3.3`, []string{"", "3.3.3.3"}},
		{"Disallowed characters in unquoted value", `For=[2607:f8b0:4004:83f::200e]`, []string{"2607:f8b0:4004:83f::200e"}},
		{"IPv6 brackets", `For="2607:f8b0:4004:83f::200e"`, []string{"2607:f8b0:4004:83f::200e"}},
		{"IPv4 brackets", `For="[1.1.1.1]"`, []string{"1.1.1.1"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := items([]string{tt.fwd}, true)
			if strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("items = %q, want %q", got, tt.want)
			}
			// The walk: the rightmost item is the client when it is an
			// address, else the header is unreadable.
			r := mustNew(t, Options{TrustedProxies: []string{"10.0.0.1"}, IPv6Prefix: 128, Header: "Forwarded"})
			want := tt.want[len(tt.want)-1]
			k, err := r.Key("10.0.0.1:1", http.Header{"Forwarded": {tt.fwd}})
			if want == "" {
				if !errors.Is(err, ErrUnreadable) {
					t.Fatalf("Key = %q, %v; want ErrUnreadable", k, err)
				}
				return
			}
			if k != want || err != nil {
				t.Fatalf("Key = %q, %v; want %q", k, err, want)
			}
		})
	}
}

func TestRealClientIPRanges(t *testing.T) {
	for _, tt := range []struct {
		name    string
		ranges  []string
		want    []string
		wantErr bool
	}{
		{name: "Empty input", ranges: []string{}},
		{name: "Single IPv4 address", ranges: []string{"1.1.1.1"}, want: []string{"1.1.1.1/32"}},
		{name: "Single IPv6 address", ranges: []string{"2607:f8b0:4004:83f::200e"}, want: []string{"2607:f8b0:4004:83f::200e/128"}},
		{name: "Single IPv4 range", ranges: []string{"1.1.1.1/16"}, want: []string{"1.1.0.0/16"}},
		{name: "Single IPv6 range", ranges: []string{"2607:f8b0:4004:83f::200e/48"}, want: []string{"2607:f8b0:4004::/48"}},
		{
			name: "Mixed input",
			ranges: []string{
				"1.1.1.1", "2607:f8b0:4004:83f::200e",
				"1.1.1.1/32", "2607:f8b0:4004:83f::200e/128",
				"1.1.1.1/16", "2607:f8b0:4004:83f::200e/56",
				"::ffff:188.0.2.128/112", "::ffff:bc15:0006/104",
				"64:ff9b::188.0.2.128/112",
			},
			want: []string{
				"1.1.1.1/32", "2607:f8b0:4004:83f::200e/128",
				"1.1.1.1/32", "2607:f8b0:4004:83f::200e/128",
				"1.1.0.0/16", "2607:f8b0:4004:800::/56",
				"188.0.0.0/16", "188.0.0.0/8",
				"64:ff9b::bc00:0/112",
			},
		},
		{name: "No input", ranges: nil},
		{name: "Error: garbage CIDR", ranges: []string{"2607:f8b0:4004:83f::200e/nope"}, wantErr: true},
		{name: "Error: CIDR with zone", ranges: []string{"fe80::abcd%nope/64"}, wantErr: true},
		{name: "Error: garbage IP", ranges: []string{"1.1.1.nope"}, wantErr: true},
		{name: "Error: empty value", ranges: []string{""}, wantErr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r, err := New(Options{TrustedProxies: tt.ranges})
			if (err != nil) != tt.wantErr {
				t.Fatalf("New: %v, want an error: %v", err, tt.wantErr)
			}
			if err != nil {
				return
			}
			var got []string
			for _, p := range r.trusted {
				got = append(got, p.String())
			}
			if strings.Join(got, " ") != strings.Join(tt.want, " ") {
				t.Fatalf("trusted %q, want %q", got, tt.want)
			}
		})
	}
}

// TestRealClientIPRightmostTrustedRange is the rightmost walk's table.
// realclientip-go reads the header whatever the peer; here the peer
// 10.9.9.9 is a trusted proxy in every case (added to the ranges), and
// its failures ("") are the peer's key.
func TestRealClientIPRightmostTrustedRange(t *testing.T) {
	const peer = "10.9.9.9"
	xff := http.Header{
		"X-Real-Ip":       {`1.1.1.1`},
		"X-Forwarded-For": {`2.2.2.2:3384, 3.3.3.3`, `4.4.4.4`},
	}
	for _, tt := range []struct {
		name    string
		header  string
		headers http.Header
		ranges  []string
		want    string // "": ErrUnreadable (realclientip-go's "")
	}{
		{"No ranges", "X-Forwarded-For", xff, nil, "4.4.4.4"},
		{"One range", "X-Forwarded-For", xff, []string{`4.4.4.0/24`}, "3.3.3.3"},
		{"One IP", "X-Forwarded-For", xff, []string{`4.4.4.4`}, "3.3.3.3"},
		{"Many kinds of ranges", "Forwarded", http.Header{
			"X-Real-Ip":       {`1.1.1.1`},
			"X-Forwarded-For": {`2.2.2.2:3384, 3.3.3.3`, `4.4.4.4`},
			"Forwarded": {
				`For=99.99.99.99, For=4.4.4.8, For="[2607:f8b0:4004:83f::200e]:4747"`,
				`For=2.2.2.2:8883, For=64:ff9b::188.0.2.200, For=3.3.5.5, For=2001:db7::abcd`,
			},
		}, []string{
			`2.2.2.2/32`, `2607:f8b0:4004:83f::200e/128`,
			`3.3.0.0/16`, `2001:db7::/64`,
			`::ffff:4.4.4.4/124`, `64:ff9b::188.0.2.128/112`,
		}, "99.99.99.99"},
		// A few of realclientip-go's ranges.Cloudflare, enough for the case.
		{"Cloudflare ranges", "X-Forwarded-For", http.Header{
			"X-Real-Ip":       {`1.1.1.1`},
			"X-Forwarded-For": {`2.2.2.2:3384, 3.3.3.3`, `4.4.4.4`, `2400:cb00::1`},
		}, []string{"173.245.48.0/20", "103.21.244.0/22", "2400:cb00::/32", "2606:4700::/32"}, "4.4.4.4"},
		{"Fail: no non-trusted IP", "X-Forwarded-For", http.Header{
			"X-Forwarded-For": {`2.2.2.2:3384, 2.2.2.3`, `2.2.2.4`},
		}, []string{`2.2.2.0/24`}, ""},
		{"Fail: rightmost non-trusted IP invalid", "X-Forwarded-For", http.Header{
			"X-Forwarded-For": {`nope, 2.2.2.2:3384, 2.2.2.3`, `2.2.2.4`},
		}, []string{`2.2.2.0/24`}, ""},
		{"Fail: rightmost non-trusted IP unspecified", "X-Forwarded-For", http.Header{
			"X-Forwarded-For": {`::, 2.2.2.2:3384, 2.2.2.3`, `2.2.2.4`},
		}, []string{`2.2.2.0/24`}, ""},
		// A deviation: no value at all is the proxy's own request (its
		// health check), keyed as the proxy; realclientip-go gives "".
		{"No values in header: the proxy itself", "X-Forwarded-For", http.Header{
			"X-Real-Ip": {`1.1.1.1`}, "X-Forwarded-For": {},
		}, []string{`2.2.2.0/24`}, peer},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := mustNew(t, Options{TrustedProxies: append([]string{peer}, tt.ranges...), Header: tt.header, IPv6Prefix: 128})
			got, err := r.Key(peer+":443", tt.headers)
			if tt.want == "" {
				if !errors.Is(err, ErrUnreadable) {
					t.Fatalf("Key = %q, %v; want ErrUnreadable", got, err)
				}
				return
			}
			if got != tt.want || err != nil {
				t.Fatalf("Key = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
	// realclientip-go's "Error: empty header name" and "Error: bad header
	// name": the one header to read is Forwarded or X-Forwarded-For.
	for _, h := range []string{"Not-XFF-Or-Forwarded", "X-Real-Ip"} {
		if _, err := New(Options{Header: h}); err == nil || !strings.Contains(err.Error(), h) {
			t.Errorf("Header %q: %v, want an error naming it", h, err)
		}
	}
}
