package idemmaint

import (
	"net/url"
	"path"
	"strings"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// A key with every character that means something in a URL.
const awkwardKey = `a/b?c&d=e#f%20g+h i;j,k:l@m$n!o'p(q)r*s[t]u{v}w|x\y^z"` + "`<>"

func TestURLTemplateExpand(t *testing.T) {
	t.Parallel()
	id := idemstore.Identity{Endpoint: "POST /v1/a%2Fb", Key: "k-1"}
	scoped := idemstore.Identity{Scope: "acme corp", Endpoint: "POST /v1/a%2Fb", Key: "k-1"}
	tests := []struct {
		name, template string
		id             idemstore.Identity
		want           string
	}{
		{name: "key in the path", template: "https://api.example/orders/by-key/{key}", id: id,
			want: "https://api.example/orders/by-key/k-1"},
		{name: "every placeholder", template: "http://127.0.0.1:9000/lookup/{key}?m={method}&p={path}&s={scope}", id: scoped,
			want: "http://127.0.0.1:9000/lookup/k-1?m=POST&p=%2Fv1%2Fa%252Fb&s=acme%20corp"},
		{name: "placeholder twice", template: "http://h/{key}/{key}", id: id, want: "http://h/k-1/k-1"},
		{name: "adjacent placeholders", template: "http://h/{method}{key}", id: id, want: "http://h/POSTk-1"},
		{name: "literal around", template: "http://h/x-{key}-y?v=1", id: id, want: "http://h/x-k-1-y?v=1"},
		{name: "empty scope", template: "http://h/{key}?s={scope}", id: idemstore.Identity{Endpoint: "POST /", Key: "k"},
			want: "http://h/k?s="},
		{name: "unreserved kept", template: "http://h/{key}", id: idemstore.Identity{Key: "AZaz09-._~"}, want: "http://h/AZaz09-._~"},
		{name: "reserved escaped", template: "http://h/{key}", id: idemstore.Identity{Key: "/?&#+% =;"},
			want: "http://h/%2F%3F%26%23%2B%25%20%3D%3B"},
		{name: "non-ASCII bytes", template: "http://h/?k={key}", id: idemstore.Identity{Key: "é\x00"}, want: "http://h/?k=%C3%A9%00"},
		{name: "all dots escaped", template: "http://h/?k={key}", id: idemstore.Identity{Key: ".."}, want: "http://h/?k=%2E%2E"},
		{name: "dots beside literal text", template: "http://h/x{key}/{key}.json", id: idemstore.Identity{Key: "..."},
			want: "http://h/x%2E%2E%2E/%2E%2E%2E.json"},
		{name: "dots among other characters", template: "http://h/{key}", id: idemstore.Identity{Key: "a..b."}, want: "http://h/a..b."},
		{name: "empty scope in the query", template: "http://h/{key}?s={scope}&t={scope}", id: idemstore.Identity{Key: "k"},
			want: "http://h/k?s=&t="},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tmpl, err := ParseURLTemplate(tt.template)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Expand(tt.id)
			if err != nil || got != tt.want {
				t.Errorf("Expand = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// A key decodes to itself from the path and from the query alike.
func TestURLTemplateRoundTrip(t *testing.T) {
	t.Parallel()
	tmpl, err := ParseURLTemplate("http://h/by-key/{key}?key={key}&path={path}&scope={scope}")
	if err != nil {
		t.Fatal(err)
	}
	id := idemstore.Identity{Scope: awkwardKey, Endpoint: "PATCH /v1/orders/7%2F8", Key: awkwardKey}
	checkRoundTrip(t, tmpl, id)
}

func checkRoundTrip(t *testing.T, tmpl *URLTemplate, id idemstore.Identity) {
	t.Helper()
	raw, err := tmpl.Expand(id)
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatalf("the expansion is not a URL: %v", err)
	}
	seg, err := url.PathUnescape(strings.TrimPrefix(u.EscapedPath(), "/by-key/"))
	if err != nil || seg != id.Key {
		t.Errorf("key from the path = %q, %v; want %q", seg, err, id.Key)
	}
	q := u.Query()
	if q.Get("key") != id.Key || q.Get("scope") != id.Scope || q.Get("path") != strings.SplitN(id.Endpoint, " ", 2)[1] {
		t.Errorf("query %v does not give back key %q, scope %q, endpoint %q", q, id.Key, id.Scope, id.Endpoint)
	}
	if u.Host != "h" || u.Fragment != "" {
		t.Errorf("the expansion moved the host or made a fragment: %q", raw)
	}
}

// A value that would make a path segment of only dots or slashes, or an
// empty one, is refused: a server that cleans paths would answer for
// another path. The same values are looked up from the query.
func TestURLTemplateExpandRefusesPathSyntax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		template string
		id       idemstore.Identity
		filler   string
	}{
		{"http://h/by-key/{key}", idemstore.Identity{Key: "."}, "key"},
		{"http://h/by-key/{key}", idemstore.Identity{Key: ".."}, "key"},
		{"http://h/by-key/{key}", idemstore.Identity{Key: "..."}, "key"},
		{"http://h/by-key/{key}", idemstore.Identity{Key: "/"}, "key"},
		{"http://h/by-key/{key}/status", idemstore.Identity{Key: "./../"}, "key"},
		{"http://h/by-key/{key}?x=1", idemstore.Identity{Key: "//"}, "key"},
		{"http://h/{key}{key}", idemstore.Identity{Key: "."}, "key"},
		{"http://h/%2E{key}", idemstore.Identity{Key: "."}, "key"},
		{"http://h/t/{scope}/by-key/{key}", idemstore.Identity{Key: "k"}, "scope"},
		{"http://h/t/{scope}{key}", idemstore.Identity{Scope: ".", Key: "."}, "key"},
	}
	for _, tt := range tests {
		tmpl, err := ParseURLTemplate(tt.template)
		if err != nil {
			t.Fatal(err)
		}
		want := "{" + tt.filler + "} would make a path segment of only dots or slashes, or an empty one"
		if got, err := tmpl.Expand(tt.id); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s with %+v: %q, %v; want an error containing %q", tt.template, tt.id, got, err, want)
		}
		query := strings.Replace(tt.template, "http://h/", "http://h/lookup?v=", 1)
		if tmpl, err := ParseURLTemplate(query); err != nil {
			t.Fatal(err)
		} else if got, err := tmpl.Expand(tt.id); err != nil {
			t.Errorf("%s with %+v: %q, %v; want the values in the query looked up", query, tt.id, got, err)
		}
	}
}

func TestURLTemplateExpandEndpointWithoutPath(t *testing.T) {
	t.Parallel()
	for _, tmpl := range []string{"http://h/{key}?m={method}", "http://h/{key}?p={path}"} {
		tt, err := ParseURLTemplate(tmpl)
		if err != nil {
			t.Fatal(err)
		}
		for _, ep := range []string{"payments", " /x", "POST "} {
			if got, err := tt.Expand(idemstore.Identity{Endpoint: ep, Key: "k"}); err == nil || !strings.Contains(err.Error(), "is not METHOD PATH") {
				t.Errorf("%s with endpoint %q: %q, %v; want an error", tmpl, ep, got, err)
			}
		}
	}
	// Without {method} and {path} any endpoint will do.
	tt, _ := ParseURLTemplate("http://h/{key}")
	if got, err := tt.Expand(idemstore.Identity{Endpoint: "payments", Key: "k"}); err != nil || got != "http://h/k" {
		t.Errorf("Expand = %q, %v", got, err)
	}
}

// parseErrorTests are templates ParseURLTemplate refuses, with the error.
var parseErrorTests = []struct{ template, wantErr string }{
	{"http://h/orders", "no {key} placeholder"},
	{"", "no {key} placeholder"},
	{"http://h/{id}", "unknown placeholder {id}: want {key}, {method}, {path} or {scope}"},
	{"http://h/{Key}", "unknown placeholder {Key}"},
	{"http://h/{}", "unknown placeholder {}"},
	{"http://h/{key", "a { at byte 9 is not closed by }"},
	{"http://h/{{key}}", "a { at byte 9 is not closed by }"},
	{"http://h/key}", "a } at byte 12 has no {"},
	{"ftp://h/{key}", "want an absolute http:// or https:// URL"},
	{"/orders/{key}", "want an absolute http:// or https:// URL"},
	{"h/{key}", "want an absolute http:// or https:// URL"},
	{"http:/{key}", "with a host"},
	{"http:{key}", "with a host"},
	{"http://u:p@h/{key}", "credentials in the URL are not supported"},
	{"http://h/{key}#frag", "a fragment is not allowed"},
	{"http://h/{key}#", "a fragment is not allowed"},
	{"http://{key}.example/", "a placeholder may stand in the path or the query only"},
	{"http://h{key}/", "a placeholder may stand in the path or the query only"},
	{"http://h:{key}/", "a placeholder may stand in the path or the query only"},
	{"http://h:80{key}", "a placeholder may stand in the path or the query only"},
	{"{key}://h/", "want an absolute http:// or https:// URL"},
	{"http://h/%zz/{key}", "not a URL"},
	{"http://h/\x00{key}", "not a URL"},
}

func TestParseURLTemplateRefuses(t *testing.T) {
	t.Parallel()
	for _, tt := range parseErrorTests {
		_, err := ParseURLTemplate(tt.template)
		if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("ParseURLTemplate(%q) = %v, want an error containing %q", tt.template, err, tt.wantErr)
		}
	}
}

// The errors never repeat the template, which may hold a credential.
func TestParseURLTemplateErrorsHideTheTemplate(t *testing.T) {
	t.Parallel()
	for _, tmpl := range []string{
		"http://h/%zz?api_key=SECRET",
		"ftp://h/{key}?api_key=SECRET",
		"http://h/?api_key=SECRET",
		"http://h/{key}?api_key=SECRET#x",
		"http://u:SECRET@h/{key}",
	} {
		_, err := ParseURLTemplate(tmpl)
		if err == nil || strings.Contains(err.Error(), "SECRET") {
			t.Errorf("ParseURLTemplate(%q) = %v; want an error without the secret", tmpl, err)
		}
	}
}

// cleanPath is path.Clean keeping a trailing slash, as ServeMux cleans.
func cleanPath(p string) string {
	if p == "" {
		return p
	}
	c := path.Clean(p)
	if strings.HasSuffix(p, "/") && c != "/" {
		c += "/"
	}
	return c
}

func FuzzParseURLTemplate(f *testing.F) {
	f.Add("http://h/by-key/{key}?key={key}&path={path}&scope={scope}", awkwardKey)
	for _, k := range []string{".", "..", "...", "/", "./..", "a/../b", "%2E%2E"} {
		f.Add("http://h/by-key/{key}/x?key={key}", k)
		f.Add("http://h/{scope}/{key}", k)
	}
	f.Add("https://api.example/orders/by-key/{key}", "k-1")
	for _, tt := range parseErrorTests {
		f.Add(tt.template, "k")
	}
	f.Fuzz(func(t *testing.T, template, key string) {
		tmpl, err := ParseURLTemplate(template)
		if err != nil {
			if strings.Contains(template, "{key}") && strings.Contains(err.Error(), "no {key}") {
				t.Errorf("ParseURLTemplate(%q) misses its {key}", template)
			}
			return
		}
		if !strings.Contains(template, "{key}") {
			t.Fatalf("ParseURLTemplate(%q) accepted a template without {key}", template)
		}
		base, err := url.Parse(strings.NewReplacer("{key}", "", "{method}", "", "{path}", "", "{scope}", "").Replace(template))
		if err != nil {
			t.Fatalf("the template without its placeholders is not a URL: %v", err)
		}
		id := idemstore.Identity{Scope: key, Endpoint: "POST /" + key, Key: key}
		if !tmpl.HasScope() && key != "" {
			if _, err := tmpl.Expand(id); err != errScopeDropped {
				t.Fatalf("Expand of a scoped record by %q: %v, want errScopeDropped", template, err)
			}
			tmpl = tmpl.Unscoped()
		}
		raw, err := tmpl.Expand(id)
		if err != nil {
			if strings.Trim(key, "./") != "" || !strings.Contains(err.Error(), "would make a path segment of only dots or slashes") {
				t.Fatalf("Expand with key %q: %v", key, err)
			}
			return
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatalf("the expansion %q is not a URL: %v", raw, err)
		}
		if u.Scheme != base.Scheme || u.Host != base.Host || u.User != nil || u.Fragment != "" {
			t.Fatalf("the key %q moved the scheme, host or fragment: %q from %q", key, raw, template)
		}
		// A server that cleans the escaped path (Go's ServeMux) finds
		// nothing to clean that the template did not put there; nor does one
		// that decodes it first, when the key holds no slash.
		if probed, err := url.Parse(strings.NewReplacer("{key}", "k", "{method}", "m", "{path}", "p", "{scope}", "s").Replace(template)); err == nil &&
			cleanPath(probed.EscapedPath()) == probed.EscapedPath() {
			// The path as sent (EscapedPath re-escapes it, losing %2F, when
			// the template's literal text needs escapes of its own).
			_, afterScheme, _ := strings.Cut(raw, "://")
			sent, _, _ := strings.Cut(afterScheme[strings.IndexAny(afterScheme, "/?"):], "?")
			if p := sent; cleanPath(p) != p {
				t.Fatalf("the key %q makes a path a server cleans: %q from %q", key, raw, template)
			}
			if p := u.Path; !strings.Contains(key, "/") && cleanPath(p) != p {
				t.Fatalf("the key %q makes a path a decoding server cleans: %q from %q", key, raw, template)
			}
		}
		var b strings.Builder
		escapeTo(&b, key)
		for _, unescape := range []func(string) (string, error){url.PathUnescape, url.QueryUnescape} {
			if got, err := unescape(b.String()); err != nil || got != key {
				t.Fatalf("escaped %q decodes to %q, %v", key, got, err)
			}
		}
	})
}
