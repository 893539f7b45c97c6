// Package redact hides the secrets of URLs and connection strings before
// they reach a log line or an error.
//
// URL is the project's one redaction function: every store URL, cache URL,
// upstream or provider URL, and every flag value echoed in an error goes
// through it. It does not parse the way a driver does, since the strings it
// sees are often the ones that failed to parse (a typo'd scheme, a bad
// port, a stray character): it works on the text, and when in doubt it
// hides more.
package redact

import (
	"errors"
	"strconv"
	"strings"
)

// Mask replaces every secret URL hides.
const Mask = "xxxxx"

// URL returns s fit for a log or an error message, whatever its scheme or
// shape:
//
//   - scheme://user:PASSWORD@host…: the password of the user information
//     (everything between the first ':' and the last '@' of the part
//     before the path) is masked; so is user:PASSWORD@… without a scheme
//     (a MySQL-style DSN);
//   - ?password=…&token=…: the values of query parameters whose names look
//     secret (pass, secret, token, key, auth, signature, credential) are
//     masked;
//   - host=… password=… connection strings: the values of the same keys are
//     masked, quoted ('…') or not.
//
// Anything else (sqlite:./idem.db, memory:, a duration) is returned as is.
func URL(s string) string {
	if s == "" {
		return s
	}
	if isKeywords(s) {
		return keywords(s)
	}
	s, rest := userinfo(s)
	// What follows the host holds no user information; its query may hold
	// secrets.
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		return s + rest[:i] + query(rest[i:])
	}
	return s + rest
}

// isKeywords reports whether s is a key=value connection string: its first
// word has a '=' and no URL punctuation before it.
func isKeywords(s string) bool {
	s = strings.TrimLeft(s, " \t\n")
	i := strings.IndexAny(s, "=:/@?# \t\n")
	return i > 0 && s[i] == '='
}

// userinfo masks the password of scheme://user:password@host… or
// user:password@host… (a MySQL-style DSN). It returns the masked part up to
// and including the '@' (or nothing) and the rest of s.
//
// The password may hold '/', '?' or '#' when an operator did not escape it:
// the '@' ending the user information is the last one before the first '/'
// after the scheme, or failing that the last one in s. When a query holds an
// '@', this hides more than the password, never less.
func userinfo(s string) (masked, rest string) {
	start := 0
	if i := strings.Index(s, "://"); i >= 0 {
		start = i + len("://")
	} else if strings.HasPrefix(s, "//") {
		start = len("//")
	}
	after := s[start:]
	at := -1
	if slash := strings.IndexByte(after, '/'); slash >= 0 {
		at = strings.LastIndexByte(after[:slash], '@')
	}
	if at < 0 {
		at = strings.LastIndexByte(after, '@')
	}
	if at < 0 {
		return "", s
	}
	colon := strings.IndexByte(after[:at], ':')
	if colon < 0 {
		return "", s // a user name without a password
	}
	if start == 0 && strings.ContainsAny(after[:colon], "/ ") {
		return "", s // sqlite:./a@b is a path, not user information
	}
	return s[:start+colon+1] + Mask + "@", after[at+1:]
}

// secretWords are the fragments of a parameter name whose value is hidden.
var secretWords = []string{"pass", "pwd", "secret", "token", "key", "auth", "sig", "credential"}

func isSecretName(name string) bool {
	name = strings.ToLower(name)
	for _, w := range secretWords {
		if strings.Contains(name, w) {
			return true
		}
	}
	return false
}

// query masks the values of secret-looking parameters in tail, which starts
// with '?' or '#' (or is empty). Separators are kept as they were, so a
// malformed query is shown as malformed, only without its secrets.
func query(tail string) string {
	if tail == "" {
		return tail
	}
	var b strings.Builder
	b.Grow(len(tail))
	b.WriteByte(tail[0])
	rest := tail[1:]
	for {
		i := strings.IndexAny(rest, "&;#")
		part := rest
		if i >= 0 {
			part = rest[:i]
		}
		if name, _, ok := strings.Cut(part, "="); ok && isSecretName(name) {
			b.WriteString(name + "=" + Mask)
		} else {
			b.WriteString(part)
		}
		if i < 0 {
			return b.String()
		}
		b.WriteByte(rest[i])
		rest = rest[i+1:]
	}
}

// keywords masks the secret values of a key=value connection string
// (libpq's "host=db password=s3cret", or 'quoted values').
func keywords(s string) string {
	if !strings.Contains(s, "=") {
		return s
	}
	var b strings.Builder
	b.Grow(len(s))
	for s != "" {
		// Copy the separators.
		i := 0
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n') {
			i++
		}
		b.WriteString(s[:i])
		s = s[i:]
		if s == "" {
			break
		}
		eq := strings.IndexByte(s, '=')
		sp := strings.IndexAny(s, " \t\n")
		if eq < 0 || (sp >= 0 && sp < eq) {
			// A word without '=': copy it.
			if sp < 0 {
				b.WriteString(s)
				break
			}
			b.WriteString(s[:sp])
			s = s[sp:]
			continue
		}
		name := s[:eq]
		v := s[eq+1:]
		// The value: 'quoted' (with \' escapes) or up to the next space.
		end := len(v)
		if strings.HasPrefix(v, "'") {
			end = len(v)
			for j := 1; j < len(v); j++ {
				if v[j] == '\\' {
					j++
					continue
				}
				if v[j] == '\'' {
					end = j + 1
					break
				}
			}
		} else if k := strings.IndexAny(v, " \t\n"); k >= 0 {
			end = k
		}
		b.WriteString(name + "=")
		if isSecretName(strings.TrimSpace(name)) {
			b.WriteString(Mask)
		} else {
			b.WriteString(v[:end])
		}
		s = v[end:]
	}
	return b.String()
}

// Error returns err with every occurrence of raw in its text, as written or
// quoted, replaced by URL(raw): for an error from a parser that echoes its
// input (url.Parse quotes the URL it refuses). The returned error does not
// wrap err, whose text would show raw again.
func Error(err error, raw string) error {
	if err == nil || raw == "" {
		return err
	}
	msg := err.Error()
	shown := URL(raw)
	msg = strings.ReplaceAll(msg, strconv.Quote(raw), strconv.Quote(shown))
	msg = strings.ReplaceAll(msg, raw, shown)
	return errors.New(msg)
}
