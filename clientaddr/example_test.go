package clientaddr_test

import (
	"errors"
	"fmt"
	"log"
	"net/http"

	"github.com/pglimit/pglimit/clientaddr"
)

// A service behind a load balancer in 10.0.0.0/8 that appends to
// X-Forwarded-For keys requests by the address the balancer forwarded; a
// request that did not come through the balancer is keyed by its peer
// whatever it claims, a Forwarded header the client added is never read,
// and an IPv6 client is its /64. A header from the balancer with no
// client address in it is refused, never keyed as the balancer.
func Example() {
	addrs, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	show := func(peer string, h http.Header) {
		// With net/http: addrs.Key(r.RemoteAddr, r.Header), once per
		// request, in front of every limit that keys on the address.
		key, err := addrs.Key(peer, h)
		if errors.Is(err, clientaddr.ErrUnreadable) {
			fmt.Println("400: no client address")
			return
		}
		fmt.Println(key)
	}
	show("10.0.0.5:41234", http.Header{"X-Forwarded-For": {"192.0.2.1, 203.0.113.7"}, "Forwarded": {"for=1.1.1.1"}})
	show("198.51.100.9:41234", http.Header{"X-Forwarded-For": {"203.0.113.7"}})
	show("10.0.0.5:41234", nil)
	show("10.0.0.5:41234", http.Header{"X-Forwarded-For": {"unknown"}})
	show("[2001:db8:1:2::abcd]:443", nil)
	// Output:
	// 203.0.113.7
	// 198.51.100.9
	// 10.0.0.5
	// 400: no client address
	// 2001:db8:1:2::/64
}
