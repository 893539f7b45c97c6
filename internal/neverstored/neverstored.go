// Package neverstored is the one list of the response headers never kept
// for replay, whatever an allow-list says: the middleware (package idem)
// and the reconciler by URL (idemmaint) both consult it, so what one never
// stores the other never stores either.
package neverstored

import "net/http"

// Sealed is the header under which the stores keep a sealed response's
// seal (idemstore.Response.Sealed, whose value names the format and the
// key). An upstream's header of that name is never stored: it would make a
// stored answer look sealed.
const Sealed = "Idem-Sealed"

// Replayed is the header a replay is marked with (idem.HeaderReplayed).
const Replayed = "Idempotent-Replayed"

// Attempt is the header that carries an attempt's fencing token to the
// upstream and back in a reconcile lookup (idem.HeaderAttempt).
const Attempt = "Idempotency-Attempt"

// names are the canonical names (http.CanonicalHeaderKey) of the headers
// never stored: credentials and cookies, hop-by-hop headers, the framing
// the server sets itself, and the middleware's own markers.
var names = map[string]bool{
	"Set-Cookie": true, "Set-Cookie2": true, "Authorization": true, "Proxy-Authorization": true,
	"Proxy-Authenticate": true, "Www-Authenticate": true, "Connection": true, "Keep-Alive": true,
	"Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true, "Proxy-Connection": true,
	"Content-Length": true, Replayed: true, Attempt: true, Sealed: true,
}

// Has reports whether the header of canonical name name is never stored.
func Has(name string) bool { return names[name] }

// Pack returns the header to store for a response with header h and seal
// sealed (idemstore.Response.Sealed): h, or for a sealed response the one
// header Sealed with the seal as its value, the form in which every store
// has kept sealed responses since encryption at rest began, so records
// stored before Response.Sealed existed read back the same.
func Pack(h http.Header, sealed string) http.Header {
	if sealed == "" {
		return h
	}
	return http.Header{Sealed: {sealed}}
}

// Unpack is Pack's inverse: the header and the seal of a stored header.
func Unpack(h http.Header) (http.Header, string) {
	if vs, ok := h[Sealed]; ok && len(h) == 1 && len(vs) == 1 {
		return nil, vs[0]
	}
	return h, ""
}
