package keys

import (
	"strings"
	"testing"
)

// TestStored: a key text can hold is kept; anything else becomes a digest,
// and distinct keys stay distinct.
func TestStored(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", 201)
	for _, tc := range []struct {
		in   string
		kept bool
	}{
		{"alice", true}, {"", true}, {strings.Repeat("a", 200), true},
		{long, false}, {"a\x00b", false}, {"\xff\xfe", false},
	} {
		got := Stored(tc.in)
		if (got == tc.in) != tc.kept || (!tc.kept && (!strings.HasPrefix(got, "sha256:") || len(got) != 71)) {
			t.Errorf("Stored(%q) = %q, kept %v", tc.in, got, tc.kept)
		}
	}
	if Stored("a\x00b") == Stored("a\x00c") || Stored(long) == Stored(long+"b") {
		t.Error("distinct keys share a stored form")
	}
}
