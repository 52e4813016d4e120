// Package sfv writes the few RFC 9651 (Structured Field Values) items the
// IETF RateLimit-Policy and RateLimit headers of pglimit's middlewares
// carry: a string, and an integer parameter.
package sfv

import (
	"strconv"
	"strings"
)

// String writes s as an sf-string (RFC 9651 section 4.1.6). Policy names
// are checked to need no escape; the escape is here for the rule.
func String(b *strings.Builder, s string) {
	b.WriteByte('"')
	for i := 0; i < len(s); i++ {
		if s[i] == '"' || s[i] == '\\' {
			b.WriteByte('\\')
		}
		b.WriteByte(s[i])
	}
	b.WriteByte('"')
}

// Param writes ;key=n, n an sf-integer.
func Param(b *strings.Builder, key string, n int64) {
	b.WriteByte(';')
	b.WriteString(key)
	b.WriteByte('=')
	b.WriteString(strconv.FormatInt(n, 10))
}
