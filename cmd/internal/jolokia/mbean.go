package jolokia

import (
	"errors"
	"fmt"
	"strings"
)

// ObjectName is a parsed JMX object name: a domain and its key properties,
// with quoted values unquoted.
type ObjectName struct {
	// Domain is the part before the colon, e.g. org.apache.activemq.artemis.
	Domain string
	// Keys maps each key property to its (unquoted) value.
	Keys map[string]string
}

// ParseObjectName parses a JMX object name such as
// org.apache.activemq.artemis:broker="b",component=addresses,address="q1",...
// Quoted values may hold commas, colons and equals signs, and the escapes
// \" \\ \n \* \?.
func ParseObjectName(s string) (ObjectName, error) {
	colon := strings.IndexByte(s, ':')
	if colon <= 0 {
		return ObjectName{}, fmt.Errorf("object name %q: no domain", s)
	}
	on := ObjectName{Domain: s[:colon], Keys: map[string]string{}}
	rest := s[colon+1:]
	if rest == "" {
		return ObjectName{}, fmt.Errorf("object name %q: no key properties", s)
	}
	for rest != "" {
		eq := strings.IndexByte(rest, '=')
		if eq <= 0 {
			return ObjectName{}, fmt.Errorf("object name %q: key property without a key", s)
		}
		key := rest[:eq]
		if strings.ContainsAny(key, ",:*?\"\n") {
			return ObjectName{}, fmt.Errorf("object name %q: bad key %q", s, key)
		}
		rest = rest[eq+1:]
		var val string
		if strings.HasPrefix(rest, `"`) {
			v, n, err := unquote(rest)
			if err != nil {
				return ObjectName{}, fmt.Errorf("object name %q: %w", s, err)
			}
			val, rest = v, rest[n:]
		} else {
			end := strings.IndexByte(rest, ',')
			if end < 0 {
				end = len(rest)
			}
			val, rest = rest[:end], rest[end:]
			if val == "" || strings.ContainsAny(val, "=:\"\n") {
				return ObjectName{}, fmt.Errorf("object name %q: bad value %q of key %q", s, val, key)
			}
		}
		if _, dup := on.Keys[key]; dup {
			return ObjectName{}, fmt.Errorf("object name %q: key %q twice", s, key)
		}
		on.Keys[key] = val
		if rest == "" {
			break
		}
		if rest[0] != ',' || len(rest) == 1 {
			return ObjectName{}, fmt.Errorf("object name %q: expected a comma and another key property", s)
		}
		rest = rest[1:]
	}
	return on, nil
}

// unquote reads a quoted value at the start of s and returns it and the
// number of bytes it took.
func unquote(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch c := s[i]; c {
		case '"':
			return b.String(), i + 1, nil
		case '\\':
			i++
			if i == len(s) {
				return "", 0, errors.New("unterminated quoted value")
			}
			switch s[i] {
			case '"', '\\', '*', '?':
				b.WriteByte(s[i])
			case 'n':
				b.WriteByte('\n')
			default:
				return "", 0, fmt.Errorf("bad escape \\%c in a quoted value", s[i])
			}
		case '\n':
			return "", 0, errors.New("newline in a quoted value")
		default:
			b.WriteByte(c)
		}
	}
	return "", 0, errors.New("unterminated quoted value")
}

// Quote quotes v for an object name value.
func Quote(v string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(v); i++ {
		switch c := v[i]; c {
		case '"', '\\', '*', '?':
			b.WriteByte('\\')
			b.WriteByte(c)
		case '\n':
			b.WriteString(`\n`)
		default:
			b.WriteByte(c)
		}
	}
	b.WriteByte('"')
	return b.String()
}
