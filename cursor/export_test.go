package cursor

// Names the tests reach that are not part of the package's API.

const (
	MinKeyLen  = minKeyLen
	EncodedLen = encodedLen
)

// Error is the error Parse returns.
type Error = pageError

func (e *pageError) Kind() error    { return e.kind }
func (e *pageError) Param() string  { return e.param }
func (e *pageError) Detail() string { return e.detail }
func (e *pageError) Limit() int     { return e.limit }

// GenerateKey returns a random key of the size a nil codec's has.
func GenerateKey() []byte { return generateKey() }

// NewRandomCodec is the codec NewPager makes when given none.
func NewRandomCodec() *Codec { return newRandomCodec() }

func (c *Codec) Encode(binding string, p Position) string { return c.encode(binding, p) }

// Encode is the cursor of pos for binding: the one Next returns for a full
// page whose last row is pos.
func (p *Pager) Encode(binding string, pos Position) string { return p.codec.encode(binding, pos) }

func (c *Codec) Decode(binding, s string) (Position, error) { return c.decode(binding, s) }

// Rules returns the rules in force, defaults filled in.
func (p *Pager) Rules() Rules { return p.rules }
