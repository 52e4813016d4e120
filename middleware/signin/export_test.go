package signin

import (
	"time"

	"github.com/pglimit/pglimit/internal/keys"
)

// What the tests reach that an adopter does not.

// StoredKey is storedKey.
var StoredKey = keys.Stored

// ErrNoKey is the error of a request without a key.
var ErrNoKey = errNoKey

// Strict reports whether l reserves attempts.
func (l *Limiter) Strict() bool { return l.strict }

// Limit is the number of failures that throttles a key.
func (l *Limiter) Limit() int { return l.max }

// Window is how long failures count.
func (l *Limiter) Window() time.Duration { return l.window }

// Name is the limit's name.
func (l *Limiter) Name() string { return l.name }

// Exempt reports whether Options.Exempt exempted the sign-in (tests).
func (p *Permit) Exempt() bool { return p.exempted() }
