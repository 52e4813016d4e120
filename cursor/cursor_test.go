package cursor_test

import (
	"encoding/base64"
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/pglimit/pglimit/cursor"
	"github.com/pglimit/pglimit/internal/harness/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

var testKey = []byte("0123456789abcdef0123456789abcdef")

func mustCodec(t testing.TB, key []byte) *cursor.Codec {
	t.Helper()
	c, err := cursor.NewCodec(key)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestRoundTrip(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	rng := rand.New(rand.NewPCG(1, 2))
	cases := []cursor.Position{
		{At: time.Date(2026, 10, 13, 12, 0, 0, 123456000, time.UTC), ID: 42},
		{At: time.Date(1969, 12, 31, 23, 59, 59, 999999000, time.UTC), ID: -1},
		{At: time.Unix(0, 0).UTC(), ID: 0},
		{At: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC), ID: math.MinInt64},
		{At: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC), ID: math.MaxInt64},
	}
	for range 2000 {
		// Times from 1900 to 2100 with random microseconds, ids of any sign.
		us := rng.Int64N(200*365*24*3600*1_000_000) - 70*365*24*3600*1_000_000
		cases = append(cases, cursor.Position{At: time.UnixMicro(us).UTC(), ID: int64(rng.Uint64())})
	}
	for _, p := range cases {
		s := c.Encode("event-history", p)
		if len(s) != cursor.EncodedLen {
			t.Fatalf("Encode(%v) = %q: length %d, want %d", p, s, len(s), cursor.EncodedLen)
		}
		got, err := c.Decode("event-history", s)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)): %v", p, err)
		}
		if !got.At.Equal(p.At) || got.ID != p.ID || got.At.Location() != time.UTC {
			t.Fatalf("round trip of %v gave %v", p, got)
		}
	}
}

func TestNanosecondsAreDropped(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	for _, at := range []time.Time{
		time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC),
		time.Date(1960, 1, 2, 3, 4, 5, 123456789, time.UTC), // before 1970: rounded down too
	} {
		got, err := c.Decode("b", c.Encode("b", cursor.Position{At: at, ID: 7}))
		if err != nil {
			t.Fatal(err)
		}
		if want := at.Truncate(time.Microsecond); !got.At.Equal(want) {
			t.Errorf("At = %v, want %v (microsecond precision, rounded down)", got.At, want)
		}
	}
}

func validCursor(t testing.TB, c *cursor.Codec) string {
	return c.Encode("event-history?type=alert", cursor.Position{At: time.Date(2026, 10, 13, 12, 0, 0, 654321000, time.UTC), ID: 1234567})
}

func refused(t *testing.T, c *cursor.Codec, binding, s, what string) {
	t.Helper()
	p, err := c.Decode(binding, s)
	if err == nil {
		t.Fatalf("%s: %q decoded to %v, want refused", what, s, p)
	}
	if !errors.Is(err, cursor.ErrInvalidCursor) {
		t.Fatalf("%s: error %v is not ErrInvalidCursor", what, err)
	}
}

// Every single character of a valid cursor, replaced by every other
// character of the alphabet (and by characters outside it), is refused.
func TestEveryEditedCharacterIsRefused(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	s := validCursor(t, c)
	const alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
	for i := range len(s) {
		for _, r := range alphabet + "+/=.\n\r \x00é" {
			if string(r) == s[i:i+1] {
				continue
			}
			edited := s[:i] + string(r) + s[i+1:]
			refused(t, c, "event-history?type=alert", edited, "edited character")
		}
	}
}

// Every bit of the decoded bytes, flipped, is refused (this reaches the
// version byte, the time, the id and the tag).
func TestEveryFlippedBitIsRefused(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	raw, err := base64.RawURLEncoding.DecodeString(validCursor(t, c))
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		for bit := range 8 {
			edited := append([]byte(nil), raw...)
			edited[i] ^= 1 << bit
			refused(t, c, "event-history?type=alert", base64.RawURLEncoding.EncodeToString(edited), "flipped bit")
		}
	}
}

func TestTruncatedAndExtendedAreRefused(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	s := validCursor(t, c)
	for n := range len(s) {
		refused(t, c, "event-history?type=alert", s[:n], "truncated")
		refused(t, c, "event-history?type=alert", s[n+1:], "front cut")
	}
	for _, tail := range []string{"A", "AA", "AAAA", "=", "==", "\n", s} {
		refused(t, c, "event-history?type=alert", s+tail, "extended")
		refused(t, c, "event-history?type=alert", tail+s, "prefixed")
	}
	refused(t, c, "event-history?type=alert", strings.Repeat("A", 1<<20), "oversized")
	refused(t, c, "event-history?type=alert", s[:20]+"\n"+s[20:], "newline inside")
	// The same bytes with padding or the standard alphabet are not the cursor.
	raw, _ := base64.RawURLEncoding.DecodeString(s)
	refused(t, c, "event-history?type=alert", base64.URLEncoding.EncodeToString(raw)+"=", "padded")
	std := base64.RawStdEncoding.EncodeToString(raw)
	if std != s {
		refused(t, c, "event-history?type=alert", std, "standard alphabet")
	}
}

func TestOtherBindingIsRefused(t *testing.T) {
	t.Parallel()
	c := mustCodec(t, testKey)
	s := validCursor(t, c)
	if _, err := c.Decode("event-history?type=alert", s); err != nil {
		t.Fatalf("own binding: %v", err)
	}
	for _, b := range []string{"audit-history", "event-history", "event-history?type=alerts", "alert-history?type=alert", "", "event-history?type=alert "} {
		refused(t, c, b, s, "binding "+b)
	}
}

func TestOtherKeyIsRefused(t *testing.T) {
	t.Parallel()
	old := mustCodec(t, testKey)
	rotated := mustCodec(t, []byte("fedcba9876543210fedcba9876543210"))
	s := validCursor(t, old)
	refused(t, rotated, "event-history?type=alert", s, "rotated key")
	refused(t, cursor.NewRandomCodec(), "event-history?type=alert", s, "random key")
	// Two random codecs do not share a key.
	a, b := cursor.NewRandomCodec(), cursor.NewRandomCodec()
	refused(t, b, "x", a.Encode("x", cursor.Position{ID: 1}), "another random codec")
	// The same key configured on another replica accepts it.
	replica := mustCodec(t, append([]byte(nil), testKey...))
	if _, err := replica.Decode("event-history?type=alert", s); err != nil {
		t.Fatalf("same key on another codec: %v", err)
	}
}

func TestKeys(t *testing.T) {
	t.Parallel()
	if _, err := cursor.NewCodec(make([]byte, cursor.MinKeyLen-1)); err == nil {
		t.Error("NewCodec accepted a 15-byte key")
	}
	if _, err := cursor.NewCodec(nil); err == nil {
		t.Error("NewCodec accepted no key")
	}
	k := cursor.GenerateKey()
	if len(k) != 32 {
		t.Fatalf("GenerateKey: %d bytes", len(k))
	}
	if _, err := cursor.NewCodec(k); err != nil {
		t.Errorf("NewCodec refused a generated key: %v", err)
	}
	// The codec copies its key.
	key := append([]byte(nil), testKey...)
	c := mustCodec(t, key)
	s := c.Encode("b", cursor.Position{ID: 5})
	key[0] ^= 0xff
	if _, err := c.Decode("b", s); err != nil {
		t.Errorf("changing the caller's slice changed the codec's key: %v", err)
	}
}

func TestBinding(t *testing.T) {
	t.Parallel()
	a := cursor.Binding("event-history", map[string][]string{"type": {"alert"}, "from": {"2026-01-01T00:00:00Z"}})
	b := cursor.Binding("event-history", map[string][]string{"from": {"2026-01-01T00:00:00Z"}, "type": {"alert"}})
	if a != b {
		t.Errorf("Binding depends on map order: %q vs %q", a, b)
	}
	if want := "event-history?from=2026-01-01T00%3A00%3A00Z&type=alert"; a != want {
		t.Errorf("Binding = %q, want %q", a, want)
	}
	if got := cursor.Binding("audit-history", nil); got != "audit-history" {
		t.Errorf("Binding without filters = %q", got)
	}
}
