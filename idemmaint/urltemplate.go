package idemmaint

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/idem-dev/idem/idemstore"
)

// The placeholders of a URLTemplate.
const (
	placeholderKey    = "key"
	placeholderMethod = "method"
	placeholderPath   = "path"
	placeholderScope  = "scope"
)

// URLTemplate is a lookup URL with placeholders that name a record, such as
// https://api.example/v1/orders/by-key/{key}?scope={scope}. It is the
// --reconcile-url of `idem proxy` and `idem maintain`, and the first argument
// of HTTPReconciler.
//
// The placeholders are {key} (the record's idempotency key, required),
// {method} and {path} (the record's endpoint "METHOD PATH" split at its
// first space; for idem proxy the path as the client sent it, escapes kept)
// and {scope} (the record's scope; for idem proxy with --scope-header the
// hex SHA-256 of the header's value, empty without it).
//
// Every value is percent-encoded byte by byte except the RFC 3986 unreserved
// characters (A–Z a–z 0–9 - . _ ~), wherever the placeholder stands: a key
// with "/", "?", "&", "#", "+", "%" or a space becomes one path segment or
// one query value, and decodes to exactly the key, whether the upstream
// reads it from its path or from its query ("+" is sent as %2B, so no
// decoder reads it as a space). {path} is escaped the same way, so
// "/v1/orders" is sent as %2Fv1%2Forders: put it in the query. Placeholders
// may stand in the path and the query only, never in the scheme, the host
// or the port.
//
// No value can change the lookup's path. A value made only of dots is
// percent-encoded whole (".." is sent as %2E%2E), and Expand refuses a
// record whose values would make a path segment of only dots or slashes
// (".", "..", "...", "/"), or an empty one: a server or a proxy that
// decodes and then cleans paths (Go's ServeMux with
// GODEBUG=httpmuxgo121=1, proxies that normalise the path they forward)
// would answer for another path, and Go's ServeMux reads a lone %2F as a
// trailing slash. Such a record is not looked up; in the query any value
// is safe. A server that decodes %2F before routing reads a key with a
// "/" as several segments: put {key} in the query for it.
type URLTemplate struct {
	// parts alternate literal text and placeholder names: parts[0] is
	// literal, parts[1] a name, parts[2] literal, and so on.
	parts []string
	// endpoint reports that {method} or {path} is used.
	endpoint bool
	// scope reports that {scope} is used.
	scope bool
	// unscoped reports that scoped records may be looked up without
	// {scope} (Unscoped).
	unscoped bool
}

// probe stands for every placeholder when the template is checked as a URL:
// letters only, valid in every part of a URL.
const probe = "idemplaceholder"

// ParseURLTemplate parses a reconcile URL template. It refuses a template
// without {key}, an unknown or unclosed placeholder, a stray brace, a
// placeholder outside the path and the query, and a template that is not an
// absolute http or https URL, or that holds credentials or a fragment. Its
// errors never repeat the template, which may hold a credential in its
// query.
func ParseURLTemplate(s string) (*URLTemplate, error) {
	t := &URLTemplate{}
	var lit strings.Builder
	hasKey := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '{':
			end := strings.IndexAny(s[i+1:], "{}")
			if end < 0 || s[i+1+end] == '{' {
				return nil, fmt.Errorf("a { at byte %d is not closed by }", i)
			}
			name := s[i+1 : i+1+end]
			switch name {
			case placeholderKey:
				hasKey = true
			case placeholderMethod, placeholderPath:
				t.endpoint = true
			case placeholderScope:
				t.scope = true
			default:
				return nil, fmt.Errorf("unknown placeholder {%s}: want {key}, {method}, {path} or {scope}", clip(name, 20))
			}
			t.parts = append(t.parts, lit.String(), name)
			lit.Reset()
			i += 1 + end
		case '}':
			return nil, fmt.Errorf("a } at byte %d has no {", i)
		default:
			lit.WriteByte(c)
		}
	}
	t.parts = append(t.parts, lit.String())
	if !hasKey {
		return nil, errors.New("no {key} placeholder: every lookup would ask about the same operation")
	}
	if err := t.check(); err != nil {
		return nil, err
	}
	return t, nil
}

// HasScope reports whether the template has a {scope} placeholder.
func (t *URLTemplate) HasScope() bool { return t.scope }

// Unscoped returns a copy of t whose Expand looks up scoped records
// although t has no {scope}: for an upstream whose keys are global, where
// the same key in two scopes names one operation (--reconcile-unscoped).
// Without it, Expand refuses a scoped record when t has no {scope}.
func (t *URLTemplate) Unscoped() *URLTemplate {
	c := *t
	c.unscoped = true
	return &c
}

// check checks that the template is an absolute http or https URL whose
// placeholders stand after its host.
func (t *URLTemplate) check() error {
	if strings.Contains(t.parts[0], "://") && !t.afterAuthority() {
		return errPlaceholderPlace // before url.Parse, whose error is less clear
	}
	var b strings.Builder
	for i, p := range t.parts {
		if i%2 == 1 {
			p = probe
		}
		b.WriteString(p)
	}
	u, err := url.Parse(b.String())
	if err != nil {
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // without the URL
		}
		return fmt.Errorf("not a URL: %v", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return errors.New("want an absolute http:// or https:// URL")
	case u.Opaque != "" || u.Host == "":
		return errors.New("want an absolute http:// or https:// URL with a host")
	case u.User != nil:
		return errors.New("credentials in the URL are not supported: send them with --reconcile-header (HTTPConfig.Header)")
	case u.Fragment != "" || strings.Contains(b.String(), "#"):
		return errors.New("a fragment is not allowed")
	}
	if !t.afterAuthority() {
		return errPlaceholderPlace
	}
	return nil
}

var errScopeDropped = errors.New("the record is scoped and the template has no {scope}: the lookup would answer for " +
	"another scope's key; not looked up (add {scope}, or declare the upstream's keys global)")

var errPlaceholderPlace = errors.New("a placeholder may stand in the path or the query only, not in the scheme, host or port")

// afterAuthority reports whether the literal text before the first
// placeholder ends the authority: "scheme://host" followed by a "/" or a
// "?".
func (t *URLTemplate) afterAuthority() bool {
	_, rest, ok := strings.Cut(t.parts[0], "://")
	return ok && strings.ContainsAny(rest, "/?")
}

// clip shortens s to at most n bytes for an error message.
func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Expand returns the lookup URL of a record: the template with every
// placeholder replaced by the escaped value. It fails when the template
// uses {method} or {path} and the endpoint is not "METHOD PATH"; when the
// record has a scope and the template has no {scope} (unless Unscoped):
// the lookup would settle one tenant's record with another's answer for
// the same key; and when a value in the path would make a path segment of only dots or slashes, or
// an empty one: a server or a proxy that decodes and then cleans paths
// (removing "." and ".." segments, merging slashes) would answer for
// another path, so no key can change the lookup's path.
func (t *URLTemplate) Expand(id idemstore.Identity) (string, error) {
	method, path, ok := strings.Cut(id.Endpoint, " ")
	if t.endpoint && (!ok || method == "" || path == "") {
		return "", fmt.Errorf("endpoint %q is not METHOD PATH: {method} and {path} have no value", clip(id.Endpoint, 100))
	}
	if id.Scope != "" && !t.scope && !t.unscoped {
		return "", errScopeDropped
	}
	var (
		b       strings.Builder
		inPath  = true // before the query
		segment = 0    // where the current path segment starts in b
		filler  string // the last placeholder in the current segment
	)
	// endSegment checks the path segment that ends at b's end.
	endSegment := func() error {
		if filler != "" && onlyPathSyntax(b.String()[segment:]) {
			return fmt.Errorf("{%s} would make a path segment of only dots or slashes, or an empty one, "+
				"which a server that cleans paths reads as another path: not looked up (put {%s} in the query)", filler, filler)
		}
		return nil
	}
	for i, p := range t.parts {
		if i%2 == 1 {
			switch p {
			case placeholderKey:
				escapeTo(&b, id.Key)
			case placeholderMethod:
				escapeTo(&b, method)
			case placeholderPath:
				escapeTo(&b, path)
			case placeholderScope:
				escapeTo(&b, id.Scope)
			}
			if inPath {
				filler = p
			}
			continue
		}
		for j := 0; j < len(p); j++ {
			if c := p[j]; inPath && (c == '/' || c == '?') {
				if err := endSegment(); err != nil {
					return "", err
				}
				segment, filler = b.Len()+1, ""
				inPath = c == '/'
			}
			b.WriteByte(p[j])
		}
	}
	if inPath {
		if err := endSegment(); err != nil {
			return "", err
		}
	}
	return b.String(), nil
}

// onlyPathSyntax reports whether the escaped path segment seg decodes to
// nothing but dots and slashes, or to nothing.
func onlyPathSyntax(seg string) bool {
	for i := 0; i < len(seg); i++ {
		switch {
		case seg[i] == '.' || seg[i] == '/':
		case strings.HasPrefix(seg[i:], "%2E") || strings.HasPrefix(seg[i:], "%2e") ||
			strings.HasPrefix(seg[i:], "%2F") || strings.HasPrefix(seg[i:], "%2f"):
			i += 2
		default:
			return false
		}
	}
	return true
}

// escapeTo writes s to b with every byte but the RFC 3986 unreserved
// characters percent-encoded: the result is one path segment or one query
// value that decodes to s in either place. A value made only of dots is
// percent-encoded too (%2E%2E): "." and ".." are path syntax.
func escapeTo(b *strings.Builder, s string) {
	const hex = "0123456789ABCDEF"
	dots := strings.Trim(s, ".") == ""
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '.' && !dots || c == '_' || c == '~' {
			b.WriteByte(c)
			continue
		}
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
}
