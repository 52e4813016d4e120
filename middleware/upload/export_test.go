package upload

import "time"

// What the tests reach that an adopter does not.

// Scope is the scope key of key's slots.
var Scope = scopeOf

// FormatWindow names a window as refusals do.
var FormatWindow = formatWindow

// Limit is the number of uploads allowed in any window.
func (l *Limiter) Limit() int { return l.limit }

// Window is the length of the rolling window.
func (l *Limiter) Window() time.Duration { return l.window }

// Name is the limit's name.
func (l *Limiter) Name() string { return l.core.Name }
