package bus

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
	"testing"
)

// sign is BusNotify's payload in Go.
func sign(key []byte, seq, at int64, msg string) string {
	head := strconv.FormatInt(seq, 10) + " " + strconv.FormatInt(at, 10) + " "
	m := hmac.New(sha256.New, key)
	m.Write([]byte(head + msg))
	return head + hex.EncodeToString(m.Sum(nil)) + "\n" + msg
}

// TestVerifierRefuses: the bus hands on an authentic notification once,
// and drops every malformed, forged, tampered, replayed or stale one (a
// forged ping among them: it cannot keep a bus Live).
func TestVerifierRefuses(t *testing.T) {
	t.Parallel()
	key := []byte(strings.Repeat("k", 64))
	other := []byte(strings.Repeat("o", 64))
	const now = int64(1_800_000_000_000_000)
	good := sign(key, 7, now, "rate/api\nalice")
	tag := strings.Fields(strings.SplitN(good, "\n", 2)[0])[2]
	for _, tc := range []struct {
		name, payload string
	}{
		{"empty", ""},
		{"unsigned, as before", "rate/api\nalice"},
		{"topic alone", "rate/api"},
		{"no tag", "7 " + strconv.FormatInt(now, 10) + "\nrate/api\nalice"},
		{"short tag", "7 " + strconv.FormatInt(now, 10) + " abcd\nrate/api\nalice"},
		{"tag not hex", "7 " + strconv.FormatInt(now, 10) + " " + strings.Repeat("zz", 32) + "\nrate/api\nalice"},
		{"zero tag", "7 " + strconv.FormatInt(now, 10) + " " + strings.Repeat("00", 32) + "\nrate/api\nalice"},
		{"seq not a number", "x " + strconv.FormatInt(now, 10) + " " + tag + "\nrate/api\nalice"},
		{"seq zero", sign(key, 0, now, "rate/api\nalice")},
		{"seq negative", sign(key, -3, now, "rate/api\nalice")},
		{"time not a number", "7 now " + tag + "\nrate/api\nalice"},
		{"other key", sign(other, 7, now, "rate/api\nalice")},
		{"other key, ping", sign(other, 8, now, "ping\n0011223344556677")},
		{"key changed", strings.Replace(good, "alice", "bob", 1)},
		{"topic changed", strings.Replace(good, "rate/api", "rate/all", 1)},
		{"seq changed", "8" + good[1:]},
		{"stale", sign(key, 9, now-staleAfterMicros-1, "rate/api\nalice")},
		{"extra field", "7 " + strconv.FormatInt(now, 10) + " " + tag + " x\nrate/api\nalice"},
		{"huge", sign(other, 10, now, "rate/api\n"+strings.Repeat("x", 7900))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := newVerifier(key, now)
			if msg, ok := v.open(tc.payload); ok {
				t.Fatalf("accepted %q as %q", tc.payload, msg)
			}
			if v.top != 0 || v.horizon != now {
				t.Fatalf("a refused notification moved the verifier: top %d, horizon %d", v.top, v.horizon)
			}
		})
	}

	v := newVerifier(key, now)
	if msg, ok := v.open(good); !ok || msg != "rate/api\nalice" {
		t.Fatalf("authentic notification: %q, %v", msg, ok)
	}
	if _, ok := v.open(good); ok {
		t.Fatal("a replay was accepted")
	}
	// Out of order (commit order is not nextval order), each once.
	for _, seq := range []int64{5, 9, 6} {
		p := sign(key, seq, now+1, "signin\nbob")
		if _, ok := v.open(p); !ok {
			t.Fatalf("seq %d after 7: refused", seq)
		}
		if _, ok := v.open(p); ok {
			t.Fatalf("seq %d replayed: accepted", seq)
		}
	}
	// A later time moves the horizon: what was fresh is stale after it.
	if _, ok := v.open(sign(key, 20, now+2*staleAfterMicros, "ping\nab")); !ok {
		t.Fatal("a later ping was refused")
	}
	if _, ok := v.open(sign(key, 21, now, "signin\nbob")); ok {
		t.Fatal("a notification stamped long before the latest heard was accepted")
	}
	// Far below the window: taken as heard.
	if _, ok := v.open(sign(key, 20+seqWindow, now+2*staleAfterMicros, "signin\ncarol")); !ok {
		t.Fatal("a number far ahead was refused")
	}
	if _, ok := v.open(sign(key, 19, now+2*staleAfterMicros, "signin\ndave")); ok {
		t.Fatal("a number below the window was accepted")
	}
}
