package ratelimit_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
)

// A strict parser of RFC 9651 (Structured Field Values) lists, after its
// section 4.2 algorithms, so the tests read the RateLimit headers as a
// client that follows the RFC would: anything it does not accept, a client
// would drop.

// sfItem is a list member: a bare item (or an inner list) and its
// parameters in order.
type sfItem struct {
	value  any // int64, float64, sfString, sfToken, []byte, bool, []sfItem (inner list)
	params []sfParam
}

type sfParam struct {
	key   string
	value any
}

type sfString string
type sfToken string

func (it sfItem) param(key string) (any, bool) {
	for _, p := range it.params {
		if p.key == key {
			return p.value, true
		}
	}
	return nil, false
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eof() bool  { return p.i >= len(p.s) }
func (p *sfParser) peek() byte { return p.s[p.i] }
func (p *sfParser) errorf(format string, args ...any) error {
	return fmt.Errorf("sf: at %d of %q: %s", p.i, p.s, fmt.Sprintf(format, args...))
}

func (p *sfParser) skipSP() {
	for !p.eof() && p.peek() == ' ' {
		p.i++
	}
}

func (p *sfParser) skipOWS() {
	for !p.eof() && (p.peek() == ' ' || p.peek() == '\t') {
		p.i++
	}
}

// parseSFList parses a field value as a List (section 4.2, 4.2.1).
func parseSFList(s string) ([]sfItem, error) {
	p := &sfParser{s: s}
	p.skipSP()
	var out []sfItem
	for !p.eof() {
		it, err := p.itemOrInnerList()
		if err != nil {
			return nil, err
		}
		out = append(out, it)
		p.skipOWS()
		if p.eof() {
			break
		}
		if p.peek() != ',' {
			return nil, p.errorf("want ','")
		}
		p.i++
		p.skipOWS()
		if p.eof() {
			return nil, p.errorf("trailing ','")
		}
	}
	if len(out) == 0 {
		return nil, errors.New("sf: empty list")
	}
	return out, nil
}

func (p *sfParser) itemOrInnerList() (sfItem, error) {
	if !p.eof() && p.peek() == '(' {
		p.i++
		var inner []sfItem
		for {
			p.skipSP()
			if p.eof() {
				return sfItem{}, p.errorf("unterminated inner list")
			}
			if p.peek() == ')' {
				p.i++
				params, err := p.parameters()
				return sfItem{value: inner, params: params}, err
			}
			v, err := p.bareItem()
			if err != nil {
				return sfItem{}, err
			}
			params, err := p.parameters()
			if err != nil {
				return sfItem{}, err
			}
			inner = append(inner, sfItem{value: v, params: params})
			if p.eof() || (p.peek() != ' ' && p.peek() != ')') {
				return sfItem{}, p.errorf("want ' ' or ')'")
			}
		}
	}
	v, err := p.bareItem()
	if err != nil {
		return sfItem{}, err
	}
	params, err := p.parameters()
	return sfItem{value: v, params: params}, err
}

func (p *sfParser) parameters() ([]sfParam, error) {
	var out []sfParam
	for !p.eof() && p.peek() == ';' {
		p.i++
		p.skipSP()
		key, err := p.key()
		if err != nil {
			return nil, err
		}
		var v any = true
		if !p.eof() && p.peek() == '=' {
			p.i++
			if v, err = p.bareItem(); err != nil {
				return nil, err
			}
		}
		for j := range out {
			if out[j].key == key {
				return nil, p.errorf("parameter %q twice", key) // a client keeps the last; we want none twice
			}
		}
		out = append(out, sfParam{key: key, value: v})
	}
	return out, nil
}

func (p *sfParser) key() (string, error) {
	start := p.i
	if p.eof() || !(isLower(p.peek()) || p.peek() == '*') {
		return "", p.errorf("a key starts with a lowercase letter or '*'")
	}
	for !p.eof() && (isLower(p.peek()) || isDigit(p.peek()) || strings.IndexByte("_-.*", p.peek()) >= 0) {
		p.i++
	}
	return p.s[start:p.i], nil
}

func (p *sfParser) bareItem() (any, error) {
	if p.eof() {
		return nil, p.errorf("want an item")
	}
	switch c := p.peek(); {
	case c == '-' || isDigit(c):
		return p.number()
	case c == '"':
		return p.str()
	case c == ':':
		p.i++
		end := strings.IndexByte(p.s[p.i:], ':')
		if end < 0 {
			return nil, p.errorf("unterminated byte sequence")
		}
		b, err := base64Std(p.s[p.i : p.i+end])
		p.i += end + 1
		return b, err
	case c == '?':
		p.i++
		if p.eof() || (p.peek() != '0' && p.peek() != '1') {
			return nil, p.errorf("bad boolean")
		}
		v := p.peek() == '1'
		p.i++
		return v, nil
	case isAlpha(c) || c == '*':
		start := p.i
		for !p.eof() && (isTchar(p.peek()) || p.peek() == ':' || p.peek() == '/') {
			p.i++
		}
		return sfToken(p.s[start:p.i]), nil
	}
	return nil, p.errorf("no item starts with %q", p.peek())
}

func (p *sfParser) number() (any, error) {
	start := p.i
	if p.peek() == '-' {
		p.i++
	}
	if p.eof() || !isDigit(p.peek()) {
		return nil, p.errorf("want a digit")
	}
	dot := -1
	for !p.eof() && (isDigit(p.peek()) || (p.peek() == '.' && dot < 0)) {
		if p.peek() == '.' {
			dot = p.i
		}
		p.i++
	}
	text := p.s[start:p.i]
	if dot < 0 {
		if len(strings.TrimPrefix(text, "-")) > 15 {
			return nil, p.errorf("integer too long")
		}
		return strconv.ParseInt(text, 10, 64)
	}
	if p.i-dot-1 < 1 || p.i-dot-1 > 3 || dot-start > 12 {
		return nil, p.errorf("bad decimal")
	}
	return strconv.ParseFloat(text, 64)
}

func (p *sfParser) str() (any, error) {
	p.i++
	var b strings.Builder
	for !p.eof() {
		c := p.peek()
		p.i++
		switch {
		case c == '\\':
			if p.eof() || (p.peek() != '"' && p.peek() != '\\') {
				return nil, p.errorf("bad escape")
			}
			b.WriteByte(p.peek())
			p.i++
		case c == '"':
			return sfString(b.String()), nil
		case c < 0x20 || c > 0x7e:
			return nil, p.errorf("character %#x in a string", c)
		default:
			b.WriteByte(c)
		}
	}
	return nil, p.errorf("unterminated string")
}

func isLower(c byte) bool { return 'a' <= c && c <= 'z' }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }
func isAlpha(c byte) bool { return isLower(c) || ('A' <= c && c <= 'Z') }
func isTchar(c byte) bool {
	return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0
}

// TestSFParser checks the parser itself on lists the RFC accepts and
// rejects, so that a header it accepts is one a client accepts.
func TestSFParser(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{`"api";q=100;w=1`, true},
		{`"a";r=1;t=0, "b";r=2;t=3`, true},
		{`"default";r=999;pk=:dHJpYWwxMjEzMjM=:`, true},
		{`sugar, tea, rum`, true},
		{`(1 2);a=?1, 3.25`, true},
		{``, false},
		{`"api";q=100,`, false},
		{`"api";Q=100`, false},
		{`"api";q=1000000000000000`, false},
		{`"api" "b"`, false},
		{`"unterminated`, false},
		{`"bad\escape"`, false},
		{`"api";q=1.2345`, false},
	} {
		_, err := parseSFList(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("parseSFList(%q): err %v, want ok %v", tc.in, err, tc.ok)
		}
	}
}

func base64Std(s string) ([]byte, error) { return base64.StdEncoding.DecodeString(s) }
