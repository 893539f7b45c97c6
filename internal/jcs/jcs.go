// Package jcs canonicalises the common shape of JSON request bodies in one
// pass: RFC 8785 (JCS) for the subset of JSON whose canonical form needs no
// number conversion and no unescaping, which is what API clients send.
//
// The subset: objects whose member names are printable ASCII without
// escapes; strings without escapes or control characters, in valid UTF-8;
// integers of at most 15 digits (so exactly a double, which ECMAScript
// writes back as the same digits), other than -0; true, false and null;
// nesting up to 64 levels; whitespace anywhere JSON allows it. For such a
// text the canonical form is the text itself without whitespace and with
// the members of every object sorted by name (byte order, which is UTF-16
// order for ASCII). Anything else (a fraction, an exponent, an escape,
// a duplicate name, invalid JSON) is left to the full canonicaliser: Append
// reports false and the caller falls back, so the subset only decides which
// of two canonicalisers runs, never the result. FuzzAppend checks that
// every text Append accepts canonicalises to the same bytes with
// go-json-experiment/json's jsontext.
package jcs

import (
	"bytes"
	"slices"
	"sync"
	"unicode/utf8"
)

// maxDepth bounds the nesting the fast path handles.
const maxDepth = 64

// maxDigits bounds an integer's digits: 10^15 < 2^53, so every such integer
// is a double exactly, and ECMAScript writes it with the same digits.
const maxDigits = 15

// Append appends the canonical form of the JSON text src to dst and reports
// true when src is in the subset the package handles; otherwise it returns
// dst unchanged and false.
func Append(dst, src []byte) ([]byte, bool) {
	c := canonicalizers.Get().(*canonicalizer)
	c.src, c.i, c.out = src, 0, dst
	ok := c.value(0) && c.end()
	out := c.out
	c.src, c.out = nil, nil
	if cap(c.members) > 1024 {
		c.members = nil
	}
	if cap(c.scratch) > 64<<10 {
		c.scratch = nil
	}
	canonicalizers.Put(c)
	if !ok {
		return dst, false
	}
	return out, true
}

var canonicalizers = sync.Pool{New: func() any { return new(canonicalizer) }}

type canonicalizer struct {
	src     []byte
	i       int // next byte of src
	out     []byte
	members []member // of the objects being written, innermost last
	scratch []byte   // for reordering an object's members
}

// member is the span of one "name":value in out.
type member struct {
	start, nameEnd, end int // out[start+1:nameEnd] is the name
}

func (c *canonicalizer) skipSpace() {
	for c.i < len(c.src) {
		switch c.src[c.i] {
		case ' ', '\t', '\n', '\r':
			c.i++
		default:
			return
		}
	}
}

// end reports whether nothing but whitespace follows the value.
func (c *canonicalizer) end() bool {
	c.skipSpace()
	return c.i == len(c.src)
}

func (c *canonicalizer) value(depth int) bool {
	c.skipSpace()
	if c.i >= len(c.src) {
		return false
	}
	switch b := c.src[c.i]; {
	case b == '{':
		return depth < maxDepth && c.object(depth+1)
	case b == '[':
		return depth < maxDepth && c.array(depth+1)
	case b == '"':
		return c.string(false)
	case b == '-' || '0' <= b && b <= '9':
		return c.number()
	case b == 't':
		return c.literal("true")
	case b == 'f':
		return c.literal("false")
	case b == 'n':
		return c.literal("null")
	}
	return false
}

func (c *canonicalizer) literal(lit string) bool {
	if !bytes.HasPrefix(c.src[c.i:], []byte(lit)) {
		return false
	}
	c.i += len(lit)
	c.out = append(c.out, lit...)
	return true
}

// number copies an integer of at most maxDigits digits, other than -0.
func (c *canonicalizer) number() bool {
	start := c.i
	if c.src[c.i] == '-' {
		c.i++
	}
	digits := c.i
	for c.i < len(c.src) && '0' <= c.src[c.i] && c.src[c.i] <= '9' {
		c.i++
	}
	n := c.i - digits
	switch {
	case n == 0 || n > maxDigits:
		return false
	case c.src[digits] == '0' && (n > 1 || digits > start): // 01, -0
		return false
	case c.i < len(c.src) && (c.src[c.i] == '.' || c.src[c.i] == 'e' || c.src[c.i] == 'E'):
		return false
	}
	c.out = append(c.out, c.src[start:c.i]...)
	return true
}

// string copies a string without escapes or control characters, in valid
// UTF-8; a member name must also be ASCII.
func (c *canonicalizer) string(name bool) bool {
	start := c.i
	ascii := true
	for c.i++; c.i < len(c.src); c.i++ {
		switch b := c.src[c.i]; {
		case b == '"':
			c.i++
			if !ascii && (name || !utf8.Valid(c.src[start:c.i])) {
				return false
			}
			c.out = append(c.out, c.src[start:c.i]...)
			return true
		case b == '\\' || b < 0x20:
			return false
		case b >= 0x7f:
			ascii = false
		}
	}
	return false
}

func (c *canonicalizer) array(depth int) bool {
	c.i++ // [
	c.out = append(c.out, '[')
	c.skipSpace()
	if c.i < len(c.src) && c.src[c.i] == ']' {
		c.i++
		c.out = append(c.out, ']')
		return true
	}
	for {
		if !c.value(depth) {
			return false
		}
		c.skipSpace()
		if c.i >= len(c.src) {
			return false
		}
		switch c.src[c.i] {
		case ',':
			c.i++
			c.out = append(c.out, ',')
		case ']':
			c.i++
			c.out = append(c.out, ']')
			return true
		default:
			return false
		}
	}
}

func (c *canonicalizer) object(depth int) bool {
	c.i++ // {
	open := len(c.out)
	c.out = append(c.out, '{')
	base := len(c.members)
	defer func() { c.members = c.members[:base] }()
	c.skipSpace()
	if c.i < len(c.src) && c.src[c.i] == '}' {
		c.i++
		c.out = append(c.out, '}')
		return true
	}
	for {
		c.skipSpace()
		if c.i >= len(c.src) || c.src[c.i] != '"' {
			return false
		}
		if len(c.members) > base {
			c.out = append(c.out, ',')
		}
		m := member{start: len(c.out)}
		if !c.string(true) {
			return false
		}
		m.nameEnd = len(c.out) - 1
		c.skipSpace()
		if c.i >= len(c.src) || c.src[c.i] != ':' {
			return false
		}
		c.i++
		c.out = append(c.out, ':')
		if !c.value(depth) {
			return false
		}
		m.end = len(c.out)
		c.members = append(c.members, m)
		c.skipSpace()
		if c.i >= len(c.src) {
			return false
		}
		switch c.src[c.i] {
		case ',':
			c.i++
		case '}':
			c.i++
			c.out = append(c.out, '}')
			return c.sort(open, c.members[base:])
		default:
			return false
		}
	}
}

// sort puts the members of the object written from out[open] in order of
// their names, and reports false for a duplicate name.
func (c *canonicalizer) sort(open int, ms []member) bool {
	name := func(m member) []byte { return c.out[m.start+1 : m.nameEnd] }
	sorted := true
	for k := 1; k < len(ms); k++ {
		switch bytes.Compare(name(ms[k-1]), name(ms[k])) {
		case 0:
			return false
		case 1:
			sorted = false
		}
	}
	if sorted {
		return true
	}
	// Copy the members out, then write them back in order.
	c.scratch = append(c.scratch[:0], c.out[open+1:len(c.out)-1]...)
	shift := open + 1
	slices.SortFunc(ms, func(a, b member) int { return bytes.Compare(name(a), name(b)) })
	for k := 1; k < len(ms); k++ {
		if bytes.Equal(name(ms[k-1]), name(ms[k])) {
			return false
		}
	}
	w := open + 1
	for k, m := range ms {
		if k > 0 {
			c.out[w] = ','
			w++
		}
		w += copy(c.out[w:], c.scratch[m.start-shift:m.end-shift])
	}
	return true
}
