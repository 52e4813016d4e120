// Package netaddr reads the addresses and CIDRs that operators write
// (trusted proxies, allow and deny rules) one way: host bits cleared, an
// IPv4-mapped IPv6 address or prefix as the IPv4 one it maps, so that it
// matches the addresses it is held against, which are unmapped too.
package netaddr

import (
	"errors"
	"net/netip"
	"strings"
)

// The reasons ParsePrefix gives; each completes a sentence whose subject
// is the text read ("\"10.0.0.0/33\" is not a CIDR …").
var (
	errEmpty  = errors.New("is empty")
	errZone   = errors.New("has a zone (%), which is not allowed")
	errCIDR   = errors.New("is not a CIDR (address/length, the length at most 32 for IPv4, 128 for IPv6)")
	errAddr   = errors.New("is not an IP address or CIDR")
	errMapped = errors.New("is an IPv4-mapped IPv6 prefix shorter than /96, which mixes IPv4 and IPv6: give the IPv4 CIDR")
)

// ParsePrefix reads an address (a prefix of its full length) or a CIDR,
// with its host bits cleared; an IPv4-mapped IPv6 one is its IPv4 prefix.
// Nothing around it is trimmed, and a zone is refused. The error says why
// as the predicate of a sentence about s.
func ParsePrefix(s string) (netip.Prefix, error) {
	switch {
	case s == "":
		return netip.Prefix{}, errEmpty
	case strings.Contains(s, "%"):
		return netip.Prefix{}, errZone
	}
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, errCIDR
		}
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return netip.Prefix{}, errAddr
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		if p.Bits() < 96 {
			return netip.Prefix{}, errMapped
		}
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p.Masked(), nil
}
