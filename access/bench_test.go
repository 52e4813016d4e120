package access_test

import (
	"context"
	"net/netip"
	"testing"

	"github.com/pglimit/pglimit/access"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

// BenchmarkMatch matches a request against 10,000 rules: 4,000 IPv4
// (/32, /24 and /16, nested), 4,000 IPv6 (/128, /64, /48) and 2,000 keys,
// half of each on each list. No statement, no allocation.
func BenchmarkMatch(b *testing.B) {
	pool, _ := pgtest.NewDB(b, 4)
	ctx := context.Background()
	// SQL in a test: 10,000 rules written at once (Add writes one per
	// transaction).
	if _, err := pool.Exec(ctx, `
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END,
		       CASE i % 3
		           WHEN 0 THEN format('10.%s.%s.%s', i / 65536 % 256, i / 256 % 256, i % 256)
		           WHEN 1 THEN format('10.%s.%s.0/24', i / 256 % 256, i % 256)
		           ELSE format('172.%s.0.0/16', 16 + i % 16)
		       END
		FROM generate_series(0, 3999) AS i;
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END,
		       CASE i % 3
		           WHEN 0 THEN format('2001:db8:%s:%s::1', to_hex(i / 4096), to_hex(i % 4096))
		           WHEN 1 THEN format('2001:db8:%s:%s::/64', to_hex(i / 4096), to_hex(i % 4096))
		           ELSE format('2001:db8:%s::/48', to_hex(i))
		       END
		FROM generate_series(0, 3999) AS i;
		INSERT INTO pglimit.access_rule (list, match)
		SELECT CASE WHEN i % 2 = 0 THEN 'allow' ELSE 'deny' END, format('user:u%s', i)
		FROM generate_series(0, 1999) AS i;`); err != nil {
		b.Fatal(err)
	}
	r, err := access.New(ctx, pool, access.Options{Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name string
		addr netip.Addr
		keys []string
		want access.List
	}{
		{"v4-hit", netip.MustParseAddr("10.0.7.200"), nil, access.Deny},
		{"v4-miss", netip.MustParseAddr("192.0.2.1"), nil, access.None},
		{"v6-hit", netip.MustParseAddr("2001:db8:0:7:abcd::9"), nil, access.Deny},
		{"v6-miss", netip.MustParseAddr("2001:db9::1"), nil, access.None},
		{"key", netip.MustParseAddr("192.0.2.1"), []string{"token:7", "user:u6"}, access.Allow},
	} {
		if got := r.Match(c.addr, c.keys...); got != c.want {
			b.Fatalf("%s: Match = %v, want %v", c.name, got, c.want)
		}
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				r.Match(c.addr, c.keys...)
			}
		})
	}
}
