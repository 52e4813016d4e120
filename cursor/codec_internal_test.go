package cursor

import (
	"encoding/binary"
	"errors"
	"testing"
	"time"
)

// A cursor of another version, correctly signed with the right key and
// binding (as a future version of this package would write it), is refused
// by this version rather than misread.
func TestOtherVersionIsRefused(t *testing.T) {
	t.Parallel()
	c, err := NewCodec([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []byte{0, 2, 255} {
		var raw [rawLen]byte
		raw[0] = v
		binary.BigEndian.PutUint64(raw[1:9], uint64(time.Now().UnixMicro()))
		binary.BigEndian.PutUint64(raw[9:17], 7)
		copy(raw[payloadLen:], c.tag("b", raw[:payloadLen]))
		s := encoding.EncodeToString(raw[:])
		if p, err := c.decode("b", s); !errors.Is(err, ErrInvalidCursor) {
			t.Errorf("version %d: decoded to %v, %v", v, p, err)
		}
	}
}
