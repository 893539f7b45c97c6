package idem

import (
	"strings"
)

// MaxKeyLength is the longest idempotency key accepted, in characters.
const MaxKeyLength = 255

// keyError is a reason a key was refused. The reasons are fixed values, so
// refusing a key allocates nothing and can never echo the key.
type keyError string

func (e keyError) Error() string { return ErrKeyInvalid.Error() + ": " + string(e) }
func (e keyError) Unwrap() error { return ErrKeyInvalid }

const (
	errKeyNoField      keyError = "no field line"
	errKeyManyFields   keyError = "more than one field line"
	errKeyEmpty        keyError = "empty key"
	errKeyTooLong      keyError = "longer than 255 characters"
	errKeyList         keyError = "a list is not allowed"
	errKeyParams       keyError = "parameters are not allowed"
	errKeyAfterQuote   keyError = "unexpected characters after the closing quote"
	errKeyUnterminated keyError = "unterminated quoted string"
	errKeyEscape       keyError = `invalid escape: only \" and \\ are allowed`
	errKeyControl      keyError = "control character"
	errKeyNonASCII     keyError = "non-ASCII character"
	errKeyWhitespace   keyError = "whitespace inside an unquoted key"
	errKeyQuote        keyError = "quote inside an unquoted key"
)

// ParseKey parses the Idempotency-Key header from its field lines, as
// returned by r.Header.Values("Idempotency-Key").
//
// The key is an RFC 8941 sf-string ("abc", where \" and \\ are the only
// escapes and every character is printable ASCII) or, leniently, the bare
// form (abc: visible ASCII without DQUOTE, comma or semicolon); both forms
// address the same key. Optional whitespace around the field value is
// ignored. The key has 1 to 255 characters. More than one field line, a list
// and sf-parameters are refused.
//
// Every error wraps ErrKeyInvalid and its text never contains the key.
func ParseKey(values []string) (string, error) {
	switch len(values) {
	case 0:
		return "", errKeyNoField
	case 1:
	default:
		return "", errKeyManyFields
	}
	v := trimOWS(values[0])
	if v == "" {
		return "", errKeyEmpty
	}
	if v[0] == '"' {
		return parseQuotedKey(v)
	}
	if len(v) > MaxKeyLength {
		return "", errKeyTooLong
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c <= ' ' || c >= 0x7f || c == '"' || c == ',' || c == ';' {
			return "", bareByteError(c)
		}
	}
	return v, nil
}

// bareByteError reports why c may not appear in a bare key.
func bareByteError(c byte) error {
	switch {
	case c == ' ' || c == '\t':
		return errKeyWhitespace
	case c < 0x20 || c == 0x7f:
		return errKeyControl
	case c >= 0x80:
		return errKeyNonASCII
	case c == ',':
		return errKeyList
	case c == ';':
		return errKeyParams
	}
	return errKeyQuote
}

// parseQuotedKey parses an RFC 8941 sf-string (section 4.2.5) that makes up
// the whole of v, which starts with DQUOTE. A string without escapes is
// returned as a substring of v.
func parseQuotedKey(v string) (string, error) {
	var b strings.Builder // used only once an escape is seen
	escaped := false
	start := 1
	for i := 1; i < len(v); i++ {
		c := v[i]
		switch {
		case c == '\\':
			i++
			if i == len(v) {
				return "", errKeyUnterminated
			}
			if v[i] != '"' && v[i] != '\\' {
				return "", errKeyEscape
			}
			if !escaped {
				escaped = true
				b.Grow(len(v))
			}
			b.WriteString(v[start : i-1])
			start = i
		case c == '"':
			if rest := v[i+1:]; rest != "" {
				switch rest[0] {
				case ',':
					return "", errKeyList
				case ';':
					return "", errKeyParams
				}
				return "", errKeyAfterQuote
			}
			key := v[start:i]
			if escaped {
				b.WriteString(key)
				key = b.String()
			}
			switch {
			case key == "":
				return "", errKeyEmpty
			case len(key) > MaxKeyLength:
				return "", errKeyTooLong
			}
			return key, nil
		case c < 0x20 || c == 0x7f:
			return "", errKeyControl
		case c >= 0x80:
			return "", errKeyNonASCII
		}
	}
	return "", errKeyUnterminated
}

// trimOWS removes leading and trailing optional whitespace (SP and HTAB).
func trimOWS(s string) string {
	for s != "" && (s[0] == ' ' || s[0] == '\t') {
		s = s[1:]
	}
	for s != "" && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t') {
		s = s[:len(s)-1]
	}
	return s
}
