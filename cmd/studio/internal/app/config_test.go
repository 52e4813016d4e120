package app

import (
	"strings"
	"testing"

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
