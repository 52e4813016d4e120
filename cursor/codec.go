package cursor

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"
)

const (
	// version is the format version of the cursors this package writes; it
	// is the first byte of the signed payload.
	version byte = 1
	// minKeyLen is the shortest HMAC key NewCodec accepts; 32 bytes (what
	// a nil codec of NewPager has) are recommended.
	minKeyLen = 16
	// tagLen is the length of the HMAC-SHA256 tag a cursor carries
	// (truncated from 32 bytes).
	tagLen = 16
	// encodedLen is the length of every cursor this version writes: 33
	// bytes (version, microseconds, id, tag) in unpadded base64url.
	encodedLen = 44
	// maxLen caps what Parse looks at: a longer `after` is refused before
	// it is decoded, whatever it holds.
	maxLen = 256

	payloadLen = 1 + 8 + 8 // version, unix microseconds, id
	rawLen     = payloadLen + tagLen
	domain     = "pglimit/cursor\x00"
)

// encoding is the one alphabet cursors are written and read with: base64url
// without padding (RFC 4648 section 5), strict about trailing bits.
var encoding = base64.RawURLEncoding.Strict()

// Position is a keyset position in an index such as (occurred_at, id): the
// last row a page returned. The next page reads the rows strictly before it
// in (occurred_at DESC, id DESC) order.
type Position struct {
	// At is the row's time. A cursor keeps it to the microsecond, the
	// precision of a PostgreSQL timestamptz, and a parsed cursor gives it in
	// UTC.
	At time.Time
	// ID breaks ties between rows of the same At.
	ID int64
}

// Codec holds the HMAC-SHA256 key a Pager signs and verifies cursors with.
// It is safe for concurrent use.
//
// Every replica of a service must use the same key, given through
// configuration: a cursor written by one replica is refused by a replica
// with another key (400 invalid-cursor), which a load balancer turns into a
// client that cannot page. A random key (NewPager given no codec) is only right for a
// single process, and its cursors die with it.
type Codec struct {
	key []byte
}

// NewCodec returns a Codec signing with key, which must be at least 16
// bytes; 32 random bytes are recommended (`openssl rand -base64 32`, decoded
// from the service's configuration). The key is copied.
func NewCodec(key []byte) (*Codec, error) {
	if len(key) < minKeyLen {
		return nil, errors.New("cursor: key shorter than 16 bytes")
	}
	return &Codec{key: append([]byte(nil), key...)}, nil
}

// newRandomCodec returns a Codec with a random 32-byte key (NewPager's,
// given none). Its cursors are refused by every other process, including
// this one after a restart: replicas must share a key through
// configuration instead (NewCodec).
func newRandomCodec() *Codec {
	return &Codec{key: generateKey()}
}

// generateKey returns 32 random bytes.
func generateKey() []byte {
	key := make([]byte, 32)
	_, _ = rand.Read(key) // never fails (crypto/rand, Go 1.24+)
	return key
}

// encode returns the cursor of p for the query named by binding (see
// Binding). p.At is kept to the microsecond, rounded down.
func (c *Codec) encode(binding string, p Position) string {
	var raw [rawLen]byte
	raw[0] = version
	binary.BigEndian.PutUint64(raw[1:9], uint64(p.At.UnixMicro()))
	binary.BigEndian.PutUint64(raw[9:17], uint64(p.ID))
	copy(raw[payloadLen:], c.tag(binding, raw[:payloadLen]))
	return encoding.EncodeToString(raw[:])
}

// decode verifies s and returns its position. It refuses (ErrInvalidCursor)
// a cursor that is not exactly one this package writes: forged, edited,
// truncated, extended, oversized, of an unknown version, signed with another
// key, or made for another binding (another endpoint, other filters). The
// signature is compared in constant time.
func (c *Codec) decode(binding, s string) (Position, error) {
	if len(s) != encodedLen {
		return Position{}, invalidCursor()
	}
	// The decoder skips '\r' and '\n'; a cursor has neither, so refuse
	// anything outside the alphabet before decoding.
	for i := 0; i < len(s); i++ {
		if !isBase64URL(s[i]) {
			return Position{}, invalidCursor()
		}
	}
	var raw [rawLen]byte
	n, err := encoding.Decode(raw[:], []byte(s))
	if err != nil || n != rawLen {
		return Position{}, invalidCursor()
	}
	if !hmac.Equal(raw[payloadLen:], c.tag(binding, raw[:payloadLen])) {
		return Position{}, invalidCursor()
	}
	if raw[0] != version {
		return Position{}, invalidCursor()
	}
	us := int64(binary.BigEndian.Uint64(raw[1:9]))
	id := int64(binary.BigEndian.Uint64(raw[9:17]))
	return Position{At: time.UnixMicro(us).UTC(), ID: id}, nil
}

// tag is the truncated HMAC-SHA256 of a domain string, the binding
// (length-prefixed, so no two bindings and payloads share an input) and the
// payload.
func (c *Codec) tag(binding string, payload []byte) []byte {
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(domain))
	var n [binary.MaxVarintLen64]byte
	m.Write(n[:binary.PutUvarint(n[:], uint64(len(binding)))])
	m.Write([]byte(binding))
	m.Write(payload)
	return m.Sum(nil)[:tagLen]
}

func isBase64URL(b byte) bool {
	return 'A' <= b && b <= 'Z' || 'a' <= b && b <= 'z' || '0' <= b && b <= '9' || b == '-' || b == '_'
}
