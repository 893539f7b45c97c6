// Package headerjson encodes and decodes stored response headers in the
// form every store keeps them: the JSON encoding/json writes for an
// http.Header, {"Name":["value",...],...}. Encode and Decode give exactly
// what json.Marshal and json.Unmarshal give (the tests fuzz them against
// it); they only do the common case, names and values of printable ASCII
// that need no escaping, without reflection, and hand anything else to
// encoding/json. A replay decodes the stored header on every request.
package headerjson

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
)

// Encode returns json.Marshal(h).
func Encode(h http.Header) ([]byte, error) {
	if b, ok := encodeFast(h); ok {
		return b, nil
	}
	return json.Marshal(h)
}

// encodeFast encodes h when json.Marshal would write its names and values
// as they are, and reports false otherwise.
func encodeFast(h http.Header) ([]byte, bool) {
	if h == nil {
		return nil, false
	}
	var names [16]string
	keys := names[:0]
	n := 2
	for name, vs := range h {
		if vs == nil || !plain(name) {
			return nil, false
		}
		n += len(name) + 6
		for _, v := range vs {
			if !plain(v) {
				return nil, false
			}
			n += len(v) + 3
		}
		keys = append(keys, name)
	}
	slices.Sort(keys)
	b := make([]byte, 0, n)
	b = append(b, '{')
	for i, name := range keys {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, '"', ':', '[')
		for j, v := range h[name] {
			if j > 0 {
				b = append(b, ',')
			}
			b = append(b, '"')
			b = append(b, v...)
			b = append(b, '"')
		}
		b = append(b, ']')
	}
	return append(b, '}'), true
}

// plain reports whether encoding/json writes s as it is between quotes:
// printable ASCII other than the quote, the backslash and the characters
// it escapes for HTML.
func plain(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c > 0x7e, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

// Decode returns the header json.Unmarshal decodes from s into a new
// http.Header, errors included.
func Decode(s string) (http.Header, error) {
	if h, ok := decodeFast(s); ok {
		return h, nil
	}
	h := make(http.Header)
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, err
	}
	return h, nil
}

// decodeFast decodes s if it is in the form json.Marshal writes for plain
// headers, give or take white space between tokens (PostgreSQL's jsonb
// prints ": " and ", "): no null, strings of printable ASCII with no
// escapes. It reports false for anything else.
func decodeFast(s string) (http.Header, bool) {
	d := decoder{s}
	if !d.consume('{') {
		return nil, false
	}
	// One map and one slice for all the values: every name opens a '['
	// and every string has two quotes, so these bound what s holds.
	names := strings.Count(s, "[")
	values := make([]string, 0, max(strings.Count(s, `"`)/2-names, 0))
	h := make(http.Header, names)
	if d.consume('}') {
		return h, d.end()
	}
	for {
		name, ok := d.str()
		if !ok || !d.consume(':') || !d.consume('[') {
			return nil, false
		}
		first := len(values)
		if !d.consume(']') {
			for {
				v, ok := d.str()
				if !ok || len(values) == cap(values) {
					return nil, false
				}
				values = append(values, v)
				if d.consume(']') {
					break
				}
				if !d.consume(',') {
					return nil, false
				}
			}
		}
		h[name] = values[first:len(values):len(values)]
		if d.consume('}') {
			return h, d.end()
		}
		if !d.consume(',') {
			return nil, false
		}
	}
}

// decoder reads JSON tokens from the front of s.
type decoder struct{ s string }

// skip drops the white space JSON allows between tokens.
func (d *decoder) skip() {
	for d.s != "" && (d.s[0] == ' ' || d.s[0] == '\t' || d.s[0] == '\n' || d.s[0] == '\r') {
		d.s = d.s[1:]
	}
}

// consume reads the byte c, reporting whether it came next.
func (d *decoder) consume(c byte) bool {
	d.skip()
	if d.s == "" || d.s[0] != c {
		return false
	}
	d.s = d.s[1:]
	return true
}

// end reports whether nothing but white space is left.
func (d *decoder) end() bool {
	d.skip()
	return d.s == ""
}

// str reads a plain string (see plainString).
func (d *decoder) str() (string, bool) {
	d.skip()
	str, rest, ok := plainString(d.s)
	if ok {
		d.s = rest
	}
	return str, ok
}

// plainString reads a JSON string at the start of s whose contents are
// printable ASCII with no escapes, and returns its contents and what
// follows it.
func plainString(s string) (str, rest string, ok bool) {
	if s == "" || s[0] != '"' {
		return "", "", false
	}
	end := strings.IndexByte(s[1:], '"')
	if end < 0 {
		return "", "", false
	}
	str = s[1 : 1+end]
	for i := 0; i < len(str); i++ {
		if c := str[i]; c < 0x20 || c > 0x7e || c == '\\' {
			return "", "", false
		}
	}
	return str, s[2+end:], true
}
