package app

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/pglimit/pglimit/quota"
)

// TestDryRunFlag: -dry-run takes the service's limit names, comma
// separated, repeated, or all; anything else is an error naming the
// known names.
func TestDryRunFlag(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{nil, nil},
		{[]string{"-dry-run", "all"}, LimitNames},
		{[]string{"-dry-run", "sql-console, uploads"}, []string{"sql-console", "uploads"}},
		{[]string{"-dry-run", "api", "-dry-run", "sign-in"}, []string{"sign-in", "api"}},
		{[]string{"-dry-run", "in-flight,all"}, LimitNames},
	} {
		c, err := ParseFlags(append([]string{"-database-url", "postgres://x"}, tc.args...))
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		var got []string
		for _, n := range LimitNames {
			if c.DryRun[n] {
				got = append(got, n)
			}
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("%v (-want +got):\n%s", tc.args, diff)
		}
	}
	for _, bad := range []string{"", "nope", "all,nope", "SQL-CONSOLE", "sql-console,", "sql console"} {
		_, err := ParseFlags([]string{"-database-url", "postgres://x", "-dry-run", bad})
		if err == nil || !strings.Contains(err.Error(), "sql-console, audit-export") {
			t.Errorf("-dry-run %q: %v; want an error listing the names", bad, err)
		}
	}
}

// TestParseCursorKey: -cursor-key takes base64 in either alphabet, padded
// or not, with surrounding space, and refuses anything else or a key
// shorter than 16 bytes.
func TestParseCursorKey(t *testing.T) {
	t.Parallel()
	k := []byte("0123456789abcdef0123456789abcdef\xff\xfe")
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.RawStdEncoding, base64.URLEncoding, base64.RawURLEncoding} {
		got, err := parseCursorKey(" " + enc.EncodeToString(k) + "\n")
		if err != nil || !cmp.Equal(got, k) {
			t.Errorf("parseCursorKey(%q) = %x, %v", enc.EncodeToString(k), got, err)
		}
	}
	for _, bad := range []string{"", "not base64!", base64.StdEncoding.EncodeToString(make([]byte, 15))} {
		if _, err := parseCursorKey(bad); err == nil {
			t.Errorf("parseCursorKey(%q) accepted", bad)
		}
	}
}

// TestParseRate reads the -api-rate forms and refuses the rest.
func TestParseRate(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in     string
		limit  int
		window time.Duration
		on     bool
		bad    bool
	}{
		{"100/s", 100, time.Second, true, false},
		{"5/m", 5, time.Minute, true, false},
		{" 20/h ", 20, time.Hour, true, false},
		{"0", 0, 0, false, false},
		{"", 0, 0, false, true},
		{"100", 0, 0, false, true},
		{"100/d", 0, 0, false, true},
		{"0/s", 0, 0, false, true},
		{"-1/s", 0, 0, false, true},
		{"1.5/s", 0, 0, false, true},
		{"1000001/s", 0, 0, false, true},
		{"x/s", 0, 0, false, true},
		{"100/S", 0, 0, false, true},
	} {
		limit, window, on, err := parseRate(tc.in)
		if (err != nil) != tc.bad || limit != tc.limit || window != tc.window || on != tc.on {
			t.Errorf("parseRate(%q) = %d, %v, %v, %v", tc.in, limit, window, on, err)
		}
	}
}

// TestAddressFlags: -trusted-proxies, -ipv6-prefix, -address-rate and
// -address-burst, their defaults, and bad values as errors naming the
// flag.
func TestAddressFlags(t *testing.T) {
	t.Parallel()
	c, err := ParseFlags([]string{"-database-url", "postgres://x"})
	if err != nil {
		t.Fatal(err)
	}
	if len(c.TrustedProxies) != 0 || c.IPv6Prefix != 64 || c.AddressRate != (Rate{20, time.Second}) || c.AddressBurst != 40 {
		t.Errorf("defaults: %q /%d %v burst %d", c.TrustedProxies, c.IPv6Prefix, c.AddressRate, c.AddressBurst)
	}
	c, err = ParseFlags([]string{"-database-url", "postgres://x", "-trusted-proxies", "10.0.0.0/8, 192.0.2.1",
		"-trusted-proxies", "2001:db8::/32", "-ipv6-prefix", "48", "-address-rate", "0", "-address-burst", "0"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Proxies{"10.0.0.0/8", "192.0.2.1", "2001:db8::/32"}, c.TrustedProxies); diff != "" || c.IPv6Prefix != 48 || c.AddressRate.Limit != 0 {
		t.Errorf("%q /%d %v", c.TrustedProxies, c.IPv6Prefix, c.AddressRate)
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-trusted-proxies", "10.0.0.0/33"}, `-trusted-proxies: "10.0.0.0/33"`},
		{[]string{"-trusted-proxies", "10.0.0.0/8,,192.0.2.1"}, `-trusted-proxies: ""`},
		{[]string{"-trusted-proxies", "proxy.example.com"}, `-trusted-proxies: "proxy.example.com"`},
		{[]string{"-trusted-proxies", "fe80::1%eth0"}, `-trusted-proxies: "fe80::1%eth0"`},
		{[]string{"-ipv6-prefix", "0"}, "-ipv6-prefix"},
		{[]string{"-ipv6-prefix", "129"}, "-ipv6-prefix"},
		{[]string{"-ipv6-prefix", "x"}, "-ipv6-prefix"},
		{[]string{"-address-rate", "20"}, "-address-rate"},
		{[]string{"-address-rate", "0/s"}, "-address-rate"},
		{[]string{"-address-burst", "0"}, "-address-burst"},
		{[]string{"-address-burst", "10001"}, "-address-burst"},
	} {
		_, err := ParseFlags(append([]string{"-database-url", "postgres://x"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error naming %s", tc.args, err, tc.want)
		}
	}
}

// TestQuotaFlags: -api-quota, -quota-timezone, -export-rows-per-day and
// -plugin-bytes-per-month, their defaults (all off, UTC), good values, and
// bad values as errors naming the flag.
func TestQuotaFlags(t *testing.T) {
	t.Parallel()
	c, err := ParseFlags([]string{"-database-url", "postgres://x"})
	if err != nil {
		t.Fatal(err)
	}
	if c.APIQuota.Limit != 0 || c.QuotaTimezone != "UTC" || c.ExportRowsPerDay != 0 || c.PluginBytesPerMonth != 0 {
		t.Errorf("defaults: %v %q %d %d", c.APIQuota, c.QuotaTimezone, c.ExportRowsPerDay, c.PluginBytesPerMonth)
	}
	for _, tc := range []struct {
		arg  string
		want Quota
	}{
		{"1000/day", Quota{1000, quota.Day}},
		{" 5/month ", Quota{5, quota.Month}},
		{"9007199254740992/month", Quota{quota.MaxLimit, quota.Month}},
		{"0", Quota{}},
	} {
		c, err := ParseFlags([]string{"-database-url", "postgres://x", "-api-quota", tc.arg, "-quota-timezone", "Europe/Paris",
			"-export-rows-per-day", "500", "-plugin-bytes-per-month", "1048576"})
		if err != nil {
			t.Fatalf("-api-quota %q: %v", tc.arg, err)
		}
		if c.APIQuota != tc.want || c.QuotaTimezone != "Europe/Paris" || c.ExportRowsPerDay != 500 || c.PluginBytesPerMonth != 1<<20 {
			t.Errorf("-api-quota %q: %v %q %d %d", tc.arg, c.APIQuota, c.QuotaTimezone, c.ExportRowsPerDay, c.PluginBytesPerMonth)
		}
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-api-quota", "100"}, "-api-quota"},
		{[]string{"-api-quota", "100/week"}, "-api-quota"},
		{[]string{"-api-quota", "100/s"}, "-api-quota"},
		{[]string{"-api-quota", "0/day"}, "-api-quota"},
		{[]string{"-api-quota", "-1/day"}, "-api-quota"},
		{[]string{"-api-quota", "1.5/day"}, "-api-quota"},
		{[]string{"-api-quota", "9007199254740993/day"}, "-api-quota"},
		{[]string{"-api-quota", "/day"}, "-api-quota"},
		{[]string{"-api-quota", ""}, "-api-quota"},
		{[]string{"-quota-timezone", "Mars/Olympus_Mons"}, "-quota-timezone"},
		{[]string{"-quota-timezone", "Local"}, "-quota-timezone"},
		{[]string{"-quota-timezone", "../../etc/passwd"}, "-quota-timezone"},
		{[]string{"-export-rows-per-day", "-1"}, "-export-rows-per-day"},
		{[]string{"-export-rows-per-day", "lots"}, "-export-rows-per-day"},
		{[]string{"-plugin-bytes-per-month", "-5"}, "-plugin-bytes-per-month"},
		{[]string{"-plugin-bytes-per-month", "9007199254740993"}, "-plugin-bytes-per-month"},
		{[]string{"-dry-run", "quotas"}, "-dry-run"},
	} {
		_, err := ParseFlags(append([]string{"-database-url", "postgres://x"}, tc.args...))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v; want an error naming %s", tc.args, err, tc.want)
		}
	}
	c, err = ParseFlags([]string{"-database-url", "postgres://x", "-dry-run", "quota,export-rows,plugin-bytes"})
	if err != nil || !c.DryRun["quota"] || !c.DryRun["export-rows"] || !c.DryRun["plugin-bytes"] {
		t.Errorf("-dry-run quota,export-rows,plugin-bytes: %v %v", c, err)
	}
}
