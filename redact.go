package idem

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
)

// RedactJSONFields returns a Config.Redact hook that removes the members
// named by paths from stored JSON bodies: "token" removes a top-level
// member, "card.number" the member number of the object card; a path
// through an array applies to each of its objects ("items.secret"). A body
// that is not a JSON object, or whose Content-Type is not JSON, is stored
// as it is. A redacted body is re-encoded: members keep no order but
// sorted, numbers keep their text, and a trailing newline is kept.
//
// It changes what a replay returns: the first answer carries every field,
// replays lack the removed ones.
func RedactJSONFields(paths ...string) func(r *http.Request, status int, header http.Header, body []byte) []byte {
	split := make([][]string, 0, len(paths))
	for _, p := range paths {
		if p = strings.TrimSpace(p); p != "" {
			split = append(split, strings.Split(p, "."))
		}
	}
	return func(_ *http.Request, _ int, header http.Header, body []byte) []byte {
		if len(split) == 0 || !isJSONMediaType(header.Get("Content-Type")) {
			return body
		}
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.UseNumber()
		var doc map[string]any
		if err := dec.Decode(&doc); err != nil || dec.More() {
			return body
		}
		removed := false
		for _, path := range split {
			removed = redactPath(doc, path) || removed
		}
		if !removed {
			return body
		}
		var out bytes.Buffer
		enc := json.NewEncoder(&out)
		enc.SetEscapeHTML(false)
		if err := enc.Encode(doc); err != nil {
			return body
		}
		b := out.Bytes()
		if !bytes.HasSuffix(body, []byte("\n")) {
			b = bytes.TrimSuffix(b, []byte("\n"))
		}
		return b
	}
}

// redactPath removes path from v and reports whether it removed anything.
func redactPath(v any, path []string) bool {
	switch v := v.(type) {
	case map[string]any:
		if len(path) == 1 {
			_, ok := v[path[0]]
			delete(v, path[0])
			return ok
		}
		child, ok := v[path[0]]
		return ok && redactPath(child, path[1:])
	case []any:
		removed := false
		for _, e := range v {
			removed = redactPath(e, path) || removed
		}
		return removed
	}
	return false
}
