// Package neverstored is the one list of the response headers never kept
// for replay, whatever an allow-list says: the middleware (package idem)
// and the reconciler by URL (idemmaint) both consult it, so what one never
// stores the other never stores either.
package neverstored

// Sealed is the header a sealed response is stored under (its value names
// the format and the key, see idemcrypt.HeaderSealed). An upstream's header
// of that name is never stored: it would make a stored answer look sealed.
const Sealed = "Idem-Sealed"

// Replayed is the header a replay is marked with (idem.HeaderReplayed).
const Replayed = "Idempotent-Replayed"

// names are the canonical names (http.CanonicalHeaderKey) of the headers
// never stored: credentials and cookies, hop-by-hop headers, the framing
// the server sets itself, and the middleware's own markers.
var names = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true,
	"Content-Length": true, Replayed: true, Sealed: true,
}

// Has reports whether the header of canonical name name is never stored.
func Has(name string) bool { return names[name] }

// Names returns the canonical names of the headers never stored, in no
// particular order.
func Names() []string {
	out := make([]string, 0, len(names))
	for n := range names {
		out = append(out, n)
	}
	return out
}
