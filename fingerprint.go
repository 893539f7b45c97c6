package idem

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"math"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/go-json-experiment/json/jsontext"

	"github.com/idem-dev/idem/internal/jcs"
)

// fingerprintVersion is hashed first, so a change of the scheme can never
// make an old record match a request it did not see.
const fingerprintVersion = "idem-fingerprint-v1"

// Body kinds, hashed before the body so that the same bytes fingerprinted in
// two ways never collide.
const (
	bodyKindEmpty       = "empty"        // no body, whatever the media type
	bodyKindJSON        = "json"         // RFC 8785 canonical JSON
	bodyKindJSONInvalid = "json-invalid" // raw bytes labelled JSON that do not parse
	bodyKindRaw         = "raw"          // raw bytes of any other media type
)

// Query kinds.
const (
	queryKindPairs = "query"     // sorted, length-prefixed name/value pairs
	queryKindRaw   = "query-raw" // a query url.ParseQuery refuses, as sent
)

// maxPooledBuffer bounds the buffers kept in the pool, so one large body
// does not pin its memory for the life of the process.
const maxPooledBuffer = 64 << 10

// fingerprinter holds the reusable state of one Fingerprint call.
type fingerprinter struct {
	h    hash.Hash
	head []byte   // length-prefixed fields before the body
	body []byte   // the canonical JSON body
	keys []string // sorted query parameter names
	sum  [sha256.Size]byte
	hex  [2 * sha256.Size]byte
}

var fingerprinterPool = sync.Pool{New: func() any { return &fingerprinter{h: sha256.New()} }}

// Fingerprint returns the hex SHA-256 fingerprint of a request: its method,
// its endpoint (the route pattern, not the raw path), its query string and
// its body, each length-prefixed so no field can spill into the next.
//
// Query parameters are sorted by name, then value, so their order does not
// matter; a query url.ParseQuery refuses is hashed as sent. A body whose media
// type is application/json or ends in +json (parameters ignored, any case) is
// canonicalised with Canonicalize, so member order, whitespace and number
// spelling do not matter, and fc then narrows a top-level object to selected
// members; fc leaves other JSON values whole. A JSON body that does not parse
// is hashed as sent, under a different tag, and the handler decides what to
// answer. Bodies of other media types are hashed as sent. An empty body
// fingerprints alike whatever its media type.
func Fingerprint(method, endpoint, rawQuery, contentType string, body []byte, fc FingerprintConfig) string {
	f := fingerprinterPool.Get().(*fingerprinter)
	defer f.release()

	f.h.Reset()
	head := f.head[:0]
	head = appendField(head, fingerprintVersion)
	head = appendField(head, method)
	head = appendField(head, endpoint)
	head = f.appendQuery(head, rawQuery)

	kind, hashed := bodyKindRaw, body
	switch {
	case len(body) == 0:
		kind = bodyKindEmpty
	case isJSONMediaType(contentType):
		canon, err := canonicalize(f.body, body)
		f.body = canon[:0]
		if err != nil {
			kind = bodyKindJSONInvalid
			break
		}
		kind, hashed = bodyKindJSON, fc.filter(canon)
	}
	head = appendField(head, kind)
	head = binary.BigEndian.AppendUint64(head, uint64(len(hashed)))
	f.head = head[:0]
	f.h.Write(head)
	f.h.Write(hashed)

	sum := f.h.Sum(f.sum[:0])
	hex.Encode(f.hex[:], sum)
	return string(f.hex[:])
}

func (f *fingerprinter) release() {
	if cap(f.head) > maxPooledBuffer {
		f.head = nil
	}
	if cap(f.body) > maxPooledBuffer {
		f.body = nil
	}
	clear(f.keys[:cap(f.keys)])
	if cap(f.keys) > 1024 {
		f.keys = nil
	}
	fingerprinterPool.Put(f)
}

// appendField appends s to buf, preceded by its length as 8 bytes big-endian.
func appendField(buf []byte, s string) []byte {
	buf = binary.BigEndian.AppendUint64(buf, uint64(len(s)))
	return append(buf, s...)
}

// appendQuery appends the query kind and the query: for a query that parses,
// its name/value pairs sorted by name then value, each length-prefixed, all in
// one length-prefixed field.
func (f *fingerprinter) appendQuery(buf []byte, rawQuery string) []byte {
	if rawQuery == "" {
		return appendField(appendField(buf, queryKindPairs), "")
	}
	values, err := url.ParseQuery(rawQuery)
	if err != nil {
		return appendField(appendField(buf, queryKindRaw), rawQuery)
	}
	buf = appendField(buf, queryKindPairs)
	at := len(buf)
	buf = binary.BigEndian.AppendUint64(buf, 0) // length, set below
	keys := f.keys[:0]
	for k := range values {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		vs := values[k]
		slices.Sort(vs)
		for _, v := range vs {
			buf = appendField(buf, k)
			buf = appendField(buf, v)
		}
	}
	f.keys = keys
	binary.BigEndian.PutUint64(buf[at:], uint64(len(buf)-at-8))
	return buf
}

// isJSONMediaType reports whether the Content-Type value names JSON:
// application/json or any type/subtype+json, in any case, with any
// parameters.
func isJSONMediaType(contentType string) bool {
	if contentType == "application/json" {
		return true // the common case, without parsing
	}
	mt, _, _ := strings.Cut(contentType, ";")
	mt = strings.Trim(mt, " \t")
	slash := strings.IndexByte(mt, '/')
	if slash <= 0 {
		return false
	}
	if strings.EqualFold(mt, "application/json") {
		return true
	}
	sub := mt[slash+1:]
	return len(sub) > len("+json") && strings.EqualFold(sub[len(sub)-len("+json"):], "+json")
}

// filter narrows the canonical JSON value canon to the members fc selects,
// in place. canon is returned whole when fc selects nothing or canon is not
// an object.
func (fc FingerprintConfig) filter(canon []byte) []byte {
	if len(fc.Include) == 0 && len(fc.Exclude) == 0 || len(canon) < 2 || canon[0] != '{' {
		return canon
	}
	// Canonical JSON has no whitespace and its members are sorted, so a
	// subsequence of the members is again canonical. Members are moved
	// down in place: the write position never passes the read position.
	w := 1
	for r := 1; canon[r] != '}'; {
		nameEnd := skipString(canon, r)
		end := skipValue(canon, nameEnd+1)
		if fc.keeps(canon[r:nameEnd]) {
			if w > 1 {
				canon[w] = ','
				w++
			}
			w += copy(canon[w:], canon[r:end])
		}
		r = end
		if canon[r] == ',' {
			r++
		}
	}
	canon[w] = '}'
	return canon[:w+1]
}

// keeps reports whether the member whose quoted canonical name is quoted
// stays in the fingerprint.
func (fc FingerprintConfig) keeps(quoted []byte) bool {
	name := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(name, '\\') >= 0 {
		// Rare: the name has escapes, so compare its unquoted form.
		name, _ = jsontext.AppendUnquote(nil, quoted)
	}
	listed := func(list []string) bool {
		for _, s := range list {
			if s == string(name) {
				return true
			}
		}
		return false
	}
	if len(fc.Include) > 0 && !listed(fc.Include) {
		return false
	}
	return !listed(fc.Exclude)
}

// skipString returns the index just past the JSON string starting at b[i].
func skipString(b []byte, i int) int {
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return i
}

// skipValue returns the index just past the JSON value starting at b[i]. b
// must be valid JSON without whitespace, such as canonical JSON.
func skipValue(b []byte, i int) int {
	depth := 0
	for i < len(b) {
		c := b[i]
		switch c {
		case '"':
			i = skipString(b, i)
		case '{', '[':
			depth++
			i++
		case '}', ']':
			if depth == 0 {
				return i
			}
			depth--
			i++
		case ',':
			if depth == 0 {
				return i
			}
			i++
		default:
			i++
		}
		if depth == 0 && (c == '"' || c == '}' || c == ']') {
			return i
		}
	}
	return i
}

// errNumberRange reports a JSON number beyond the range of a double.
var errNumberRange = errors.New("number out of the range of IEEE 754 double precision")

// Canonicalize returns the RFC 8785 (JCS) canonical form of the JSON value
// b: members sorted by the UTF-16 code units of their names, strings in
// their minimal escaping, numbers serialised as ECMAScript serialises
// doubles, no whitespace. Invalid JSON, invalid UTF-8 (also in escapes),
// duplicate member names and numbers beyond the range of a double are
// errors; the error may quote parts of b. b is not modified.
func Canonicalize(b []byte) ([]byte, error) {
	return canonicalize(nil, b)
}

// maxDoubleText is how jsontext writes the largest double, and also a number
// too large for a double, which RFC 8785 requires to be an error.
var maxDoubleText = []byte("1.7976931348623157e+308")

// canonicalize writes the canonical form of src into buf, reusing its
// memory, and returns it.
func canonicalize(buf, src []byte) ([]byte, error) {
	// The common shape of a request body (no fractions, exponents or
	// escapes) in one pass; internal/jcs gives the same bytes as jsontext.
	if out, ok := jcs.Append(buf[:0], src); ok {
		return out, nil
	}
	v := jsontext.Value(append(buf[:0], src...))
	if err := v.Canonicalize(); err != nil {
		return v, fmt.Errorf("canonicalizing JSON: %w", err)
	}
	// jsontext clamps numbers beyond the range of a double to the largest
	// double; check the input only when the output shows a sign of that.
	if bytes.Contains(v, maxDoubleText) && hasInfiniteNumber(src) {
		return v, fmt.Errorf("canonicalizing JSON: %w", errNumberRange)
	}
	return v, nil
}

// hasInfiniteNumber reports whether the valid JSON text b holds a number that
// overflows a double.
func hasInfiniteNumber(b []byte) bool {
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '"':
			i = skipString(b, i)
		case c == '-' || '0' <= c && c <= '9':
			j := i + 1
			for j < len(b) && strings.IndexByte("0123456789.eE+-", b[j]) >= 0 {
				j++
			}
			if f, err := strconv.ParseFloat(string(b[i:j]), 64); err != nil && math.IsInf(f, 0) {
				return true
			}
			i = j
		default:
			i++
		}
	}
	return false
}
