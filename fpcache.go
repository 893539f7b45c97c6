package idem

import "sync"

// The fingerprint cache bounds: at most fpCacheEntries bodies of at most
// fpCacheMaxBody bytes each are remembered, so its memory stays under
// fpCacheEntries × fpCacheMaxBody plus the map overhead (about 4 MiB).
const (
	fpCacheEntries = 2048
	fpCacheMaxBody = 2 << 10
)

// fpCache remembers the fingerprints of recent JSON requests, so that a
// retry (the same bytes again, which is what a retry is) is not
// canonicalised a second time: RFC 8785 canonicalisation is most of the
// cost of a fingerprint.
//
// It is keyed by the exact body bytes and checked against every other input
// of the fingerprint, so a hit returns exactly what Fingerprint would
// compute: there is no hash to collide. The scope is part of the check, so
// one tenant cannot learn from timing what another recently sent.
//
// Two generations bound it: entries go into cur; when cur is full it
// becomes old and a new cur starts; a hit in old moves the entry to cur.
type fpCache struct {
	mu       sync.Mutex
	cur, old map[string]fpEntry // by body
}

// fpEntry is what, besides the body, a cached fingerprint was computed from.
type fpEntry struct {
	method, endpoint, query, scope string
	fp                             string
}

func (e *fpEntry) matches(method, endpoint, query, scope string) bool {
	return e.method == method && e.endpoint == endpoint && e.query == query && e.scope == scope
}

// fingerprint returns Fingerprint of the request, from the cache when the
// same JSON request was fingerprinted recently.
func (c *fpCache) fingerprint(method, endpoint, query, contentType, scope string, body []byte, fc FingerprintConfig) string {
	if len(body) == 0 || len(body) > fpCacheMaxBody || !isJSONMediaType(contentType) {
		return Fingerprint(method, endpoint, query, contentType, body, fc)
	}
	c.mu.Lock()
	e, inCur := c.cur[string(body)]
	if !inCur {
		e = c.old[string(body)]
	}
	hit := e.fp != "" && e.matches(method, endpoint, query, scope)
	if hit && !inCur {
		c.put(string(body), e) // keep it past the next turn of generations
	}
	c.mu.Unlock()
	if hit {
		return e.fp
	}
	fp := Fingerprint(method, endpoint, query, contentType, body, fc)
	c.mu.Lock()
	c.put(string(body), fpEntry{method: method, endpoint: endpoint, query: query, scope: scope, fp: fp})
	c.mu.Unlock()
	return fp
}

// put adds an entry; the caller holds c.mu.
func (c *fpCache) put(body string, e fpEntry) {
	if len(c.cur) >= fpCacheEntries/2 || c.cur == nil {
		c.old, c.cur = c.cur, make(map[string]fpEntry, fpCacheEntries/2)
	}
	c.cur[body] = e
}
