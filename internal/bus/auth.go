package bus

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"hash"
	"strconv"
	"strings"
)

// Freshness of the notifications a bus accepts (see verifier).
const (
	// staleAfter is how far behind the latest time the bus has heard (or
	// the database's clock when it connected) a notification's time may
	// be. A notification is stamped by the statement that sends it, an
	// autocommit pg_notify delivered at its commit, so a genuine one is
	// that far behind only when its commit took that long.
	staleAfterMicros = 30 * 1_000_000
	// seqWindow is how many sequence numbers below the highest it heard a
	// bus remembers having heard (a bitmap of 8 kB).
	seqWindow = 1 << 16
)

// verifier opens the notifications of one listening connection: it checks
// each one's tag under the key read when it connected, and drops forgeries
// (a wrong tag: a role that cannot read pglimit.bus_key cannot make one)
// and replays (a number heard already, or a time older than staleAfter
// behind the latest heard). A forged or replayed notification costs a
// parse and at most one HMAC-SHA256 of its payload (PostgreSQL bounds a
// payload to 8,000 bytes), and no statement.
type verifier struct {
	mac     hash.Hash
	horizon int64 // the latest time heard, µs since 1970 on the database's clock
	top     int64 // the highest sequence number heard (0: none yet)
	heard   [seqWindow / 64]uint64
	sum     []byte
}

func newVerifier(key []byte, nowMicros int64) *verifier {
	return &verifier{mac: hmac.New(sha256.New, key), horizon: nowMicros, sum: make([]byte, 0, sha256.Size)}
}

// open returns the message of an authentic notification heard for the
// first time, and false for anything else.
func (v *verifier) open(payload string) (string, bool) {
	head, msg, ok := strings.Cut(payload, "\n")
	if !ok {
		return "", false
	}
	seqText, rest, ok := strings.Cut(head, " ")
	if !ok {
		return "", false
	}
	atText, tagText, ok := strings.Cut(rest, " ")
	if !ok || len(tagText) != 2*sha256.Size {
		return "", false
	}
	seq, err := strconv.ParseInt(seqText, 10, 64)
	if err != nil || seq < 1 {
		return "", false
	}
	at, err := strconv.ParseInt(atText, 10, 64)
	if err != nil || at < v.horizon-staleAfterMicros || v.heardAlready(seq) {
		return "", false
	}
	var tag [sha256.Size]byte
	if _, err := hex.Decode(tag[:], []byte(tagText)); err != nil {
		return "", false
	}
	v.mac.Reset()
	v.mac.Write([]byte(head[:len(seqText)+1+len(atText)+1]))
	v.mac.Write([]byte(msg))
	v.sum = v.mac.Sum(v.sum[:0])
	if !hmac.Equal(v.sum, tag[:]) {
		return "", false
	}
	v.mark(seq)
	v.horizon = max(v.horizon, at)
	return msg, true
}

// heardAlready reports whether seq was heard, or is too far below the
// highest number heard to tell (then it is taken as heard).
func (v *verifier) heardAlready(seq int64) bool {
	switch {
	case v.top == 0 || seq > v.top:
		return false
	case v.top-seq >= seqWindow:
		return true
	}
	i := seq % seqWindow
	return v.heard[i/64]&(1<<(i%64)) != 0
}

// mark records seq as heard, forgetting the numbers that fall out of the
// window below it.
func (v *verifier) mark(seq int64) {
	if seq > v.top {
		if v.top == 0 || seq-v.top >= seqWindow {
			clear(v.heard[:])
		} else {
			for s := v.top + 1; s < seq; s++ {
				i := s % seqWindow
				v.heard[i/64] &^= 1 << (i % 64)
			}
		}
		v.top = seq
	}
	i := seq % seqWindow
	v.heard[i/64] |= 1 << (i % 64)
}
