package idemredis

import (
	"encoding/json"
	"net/http"
	"strings"
)

// decodeHeader decodes a header as encodeResponse stores it, json.Marshal
// of an http.Header: {"Name":["value",...],...}. It is what
// json.Unmarshal into a new http.Header gives, errors included; the common
// case, names and values of printable ASCII without escapes, is decoded by
// hand, anything else by encoding/json.
func decodeHeader(s string) (http.Header, error) {
	if h, ok := decodeHeaderFast(s); ok {
		return h, nil
	}
	h := make(http.Header)
	if err := json.Unmarshal([]byte(s), &h); err != nil {
		return nil, err
	}
	return h, nil
}

// decodeHeaderFast decodes s if it is in the exact form json.Marshal writes
// for plain headers: no white space, no null, strings of printable ASCII
// with no escapes. It reports false for anything else.
func decodeHeaderFast(s string) (http.Header, bool) {
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	h := make(http.Header)
	s = s[1 : len(s)-1]
	for s != "" {
		name, rest, ok := plainString(s)
		if !ok || len(rest) < 2 || rest[0] != ':' || rest[1] != '[' {
			return nil, false
		}
		s = rest[2:]
		values := []string{}
		if s != "" && s[0] == ']' {
			s = s[1:]
		} else {
			for {
				var v string
				if v, s, ok = plainString(s); !ok || s == "" {
					return nil, false
				}
				values = append(values, v)
				if s[0] == ']' {
					s = s[1:]
					break
				}
				if s[0] != ',' {
					return nil, false
				}
				s = s[1:]
			}
		}
		h[name] = values
		if s == "" {
			break
		}
		if s[0] != ',' || len(s) == 1 {
			return nil, false
		}
		s = s[1:]
	}
	return h, true
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
