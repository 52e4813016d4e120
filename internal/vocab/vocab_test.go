package vocab

import (
	"strings"
	"testing"
	"time"
)

// TestOrDefault: a zero field takes the default, a positive one stays, a
// negative one is refused with the package and the field in the message.
func TestOrDefault(t *testing.T) {
	for _, tc := range []struct {
		name    string
		v, want time.Duration
		err     string
	}{
		{"zero takes the default", 0, 5 * time.Second, ""},
		{"positive stays", time.Millisecond, time.Millisecond, ""},
		{"negative", -time.Second, -time.Second, "pkg: Timeout -1s is negative"},
		{"smallest negative", -1, -1, "pkg: Timeout -1ns is negative"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := tc.v
			err := OrDefault("pkg", "Timeout", &v, 5*time.Second)
			if v != tc.want {
				t.Errorf("value %v, want %v", v, tc.want)
			}
			switch {
			case tc.err == "" && err != nil:
				t.Errorf("error %v, want none", err)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Errorf("error %v, want %q", err, tc.err)
			}
		})
	}
	n := int64(-3)
	if err := OrDefault("signin", "MaxBodyBytes", &n, 64); err == nil || err.Error() != "signin: MaxBodyBytes -3 is negative" {
		t.Errorf("int64: %v", err)
	}
	m := 0
	if err := OrDefault("permit", "MaxBatch", &m, 64); err != nil || m != 64 {
		t.Errorf("int: %d, %v", m, err)
	}
}
