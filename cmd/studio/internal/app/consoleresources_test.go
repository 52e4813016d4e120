package app

import (
	"strings"
	"testing"
)

// TestConsoleMemoryFlags: -sql-console-temp-file-limit and
// -sql-console-work-mem take sizes as PostgreSQL writes them (kB without a
// unit; kB, MB, GB, TB, case sensitive), -1 for no temporary file limit,
// work_mem from 64kB, neither past INT_MAX kB; anything else is a start-up
// error naming the flag, before any role is given the value.
func TestConsoleMemoryFlags(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		temp, work string
		tempKB     int64
		workKB     int64
	}{
		{"256MB", "16MB", 256 << 10, 16 << 10},
		{"-1", "64kB", -1, 64},
		{"0", "64", 0, 64},
		{"2 GB", "1TB", 2 << 20, 1 << 30},
		{"2147483647kB", "2147483647", maxKB, maxKB},
	} {
		c, err := ParseFlags([]string{"-database-url", "postgres://x", "-sql-console-temp-file-limit", tc.temp, "-sql-console-work-mem", tc.work})
		if err != nil {
			t.Errorf("%q, %q: %v", tc.temp, tc.work, err)
			continue
		}
		if kb, _ := parseKB(c.SQLConsoleTempFileLimit); kb != tc.tempKB {
			t.Errorf("temp %q: %d kB, want %d", tc.temp, kb, tc.tempKB)
		}
		if kb, _ := parseKB(c.SQLConsoleWorkMem); kb != tc.workKB {
			t.Errorf("work %q: %d kB, want %d", tc.work, kb, tc.workKB)
		}
	}
	for _, tc := range []struct{ flag, value string }{
		{"sql-console-temp-file-limit", ""},
		{"sql-console-temp-file-limit", "-2"},
		{"sql-console-temp-file-limit", "-1MB"},
		{"sql-console-temp-file-limit", "256mb"},
		{"sql-console-temp-file-limit", "256 MiB"},
		{"sql-console-temp-file-limit", "1.5GB"},
		{"sql-console-temp-file-limit", "2048GB"},
		{"sql-console-temp-file-limit", "256MB; DROP ROLE x"},
		{"sql-console-work-mem", "63kB"},
		{"sql-console-work-mem", "-1"},
		{"sql-console-work-mem", "lots"},
		{"sql-console-work-mem", "3TB"},
	} {
		_, err := ParseFlags([]string{"-database-url", "postgres://x", "-" + tc.flag, tc.value})
		if err == nil || !strings.Contains(err.Error(), "-"+tc.flag) {
			t.Errorf("-%s %q: %v; want an error naming the flag", tc.flag, tc.value, err)
		}
	}
}
