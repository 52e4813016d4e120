package app

import (
	"encoding/base64"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
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
