package clientaddr_test

import (
	"fmt"
	"log"
	"net/http"

	"github.com/pglimit/pglimit/clientaddr"
)

// A service behind a load balancer in 10.0.0.0/8 keys requests by the
// address the balancer forwarded; a request that did not come through the
// balancer is keyed by its peer whatever it claims, and an IPv6 client is
// its /64.
func Example() {
	addrs, err := clientaddr.New(clientaddr.Options{TrustedProxies: []string{"10.0.0.0/8"}})
	if err != nil {
		log.Fatal(err)
	}
	// With net/http: addrs.Key(r.RemoteAddr, r.Header), e.g. as the Key of
	// middleware/ratelimit's Options.
	h := http.Header{"X-Forwarded-For": {"192.0.2.1, 203.0.113.7"}}
	fmt.Println(addrs.Key("10.0.0.5:41234", h))
	fmt.Println(addrs.Key("198.51.100.9:41234", h))
	fmt.Println(addrs.Key("[2001:db8:1:2::abcd]:443", nil))
	// Output:
	// 203.0.113.7
	// 198.51.100.9
	// 2001:db8:1:2::/64
}
