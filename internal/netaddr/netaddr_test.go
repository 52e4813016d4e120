package netaddr

import (
	"net/netip"
	"testing"
)

func TestParsePrefix(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		err      error
	}{
		{in: "10.0.0.1", want: "10.0.0.1/32"},
		{in: "10.1.2.3/8", want: "10.0.0.0/8"},
		{in: "2001:db8::1", want: "2001:db8::1/128"},
		{in: "2001:db8:1:2:3::/48", want: "2001:db8:1::/48"},
		{in: "::ffff:10.0.0.1", want: "10.0.0.1/32"},
		{in: "::ffff:10.1.0.0/104", want: "10.0.0.0/8"},
		{in: "::ffff:0.0.0.0/96", want: "0.0.0.0/0"},
		{in: "", err: errEmpty},
		{in: "fe80::1%eth0", err: errZone},
		{in: "fe80::%eth0/64", err: errZone},
		{in: "10.0.0.0/33", err: errCIDR},
		{in: "2001:db8::/129", err: errCIDR},
		{in: "10.0.0.0/", err: errCIDR},
		{in: "10.0.0.0/-1", err: errCIDR},
		{in: " 10.0.0.1", err: errAddr},
		{in: "proxy.example.com", err: errAddr},
		{in: "10.0.0", err: errAddr},
		{in: "::ffff:0.0.0.0/95", err: errMapped},
		{in: "::/0", want: "::/0"},
	} {
		p, err := ParsePrefix(tt.in)
		if err != tt.err {
			t.Errorf("ParsePrefix(%q): error %v, want %v", tt.in, err, tt.err)
			continue
		}
		if err == nil && p != netip.MustParsePrefix(tt.want) {
			t.Errorf("ParsePrefix(%q) = %v, want %s", tt.in, p, tt.want)
		}
	}
}

func FuzzParsePrefix(f *testing.F) {
	for _, s := range []string{"10.0.0.1", "::ffff:10.0.0.0/104", "2001:db8::/32", "x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		p, err := ParsePrefix(s)
		if err != nil {
			return
		}
		if p != p.Masked() || p.Addr().Is4In6() || p.Addr().Zone() != "" {
			t.Fatalf("ParsePrefix(%q) = %v: not masked, mapped or zoned", s, p)
		}
	})
}
