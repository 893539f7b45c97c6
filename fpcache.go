package idem

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"hash/maphash"
	"sync"
	"sync/atomic"
)

// The fingerprint cache bounds: fpCacheSlots slots, each remembering one
// body of at most fpCacheMaxBody bytes, so its memory stays under
// fpCacheSlots × fpCacheMaxBody (4 MiB) plus the slots themselves.
const (
	fpCacheSlots   = 2048
	fpCacheMaxBody = 2 << 10
)

// fpCache remembers the fingerprints of recent JSON requests, so that a
// retry (the same bytes again, which is what a retry is) is not
// canonicalised a second time: RFC 8785 canonicalisation is most of the
// cost of a fingerprint.
//
// A hit is decided by the exact body bytes and every other input of the
// fingerprint, so it returns exactly what Fingerprint would compute: the
// hash only picks the slot, a collision is a miss. The scope is part of the
// check, so one tenant cannot learn from timing what another recently sent.
//
// Only retries are remembered (see remember), so new requests, the bulk of
// the traffic, only look.
//
// It is direct-mapped: a body's hash picks one slot, and remembering a body
// overwrites it. Each slot keeps its body in a buffer of its own that later
// bodies reuse, so remembering allocates nothing here; the slot's lock
// covers the comparison and the copy.
type fpCache struct {
	// digest makes the slots keep a keyed SHA-256 of the body instead of
	// the body (set with Config.Keyring, so no request body outlives its
	// request in memory). A hit then rests on SHA-256's collision
	// resistance instead of on the bytes.
	digest bool
	once   sync.Once // makes seed, macKey and slots on first use
	seed   maphash.Seed
	macKey [32]byte
	// slots are made when first remembered into: a middleware that sees
	// few retries keeps an array of nil pointers, which costs the garbage
	// collector little to scan.
	slots *[fpCacheSlots]atomic.Pointer[fpSlot]
}

// fpSlot is one remembered fingerprint and what it was computed from.
type fpSlot struct {
	mu                             sync.Mutex
	body                           []byte // a copy (or digest, see fpCache.digest), owned by the slot
	method, endpoint, query, scope string
	fp                             string // "" while empty
}

func (s *fpSlot) matches(method, endpoint, query, scope string, body []byte) bool {
	return s.fp != "" && s.method == method && s.endpoint == endpoint && s.query == query &&
		s.scope == scope && string(s.body) == string(body)
}

// fingerprint returns Fingerprint of the request, from the cache when the
// same JSON request was remembered recently; hit reports that it was.
func (c *fpCache) fingerprint(method, endpoint, query, contentType, scope string, body []byte, fc FingerprintConfig) (fp string, hit bool) {
	if !cacheable(contentType, body) {
		return Fingerprint(method, endpoint, query, contentType, body, fc), false
	}
	s := c.slot(body).Load()
	if s == nil {
		return Fingerprint(method, endpoint, query, contentType, body, fc), false
	}
	key := c.key(body)
	s.mu.Lock()
	if s.matches(method, endpoint, query, scope, key) {
		fp := s.fp
		s.mu.Unlock()
		return fp, true
	}
	s.mu.Unlock()
	return Fingerprint(method, endpoint, query, contentType, body, fc), false
}

// remember keeps fp, the fingerprint of the request, for its next sending.
// The middleware calls it for a request whose key was already taken with
// the same fingerprint (a retry, not a new request): most first requests
// are never sent again, and remembering them would only churn the cache and
// hold memory, while a request sent twice is the one a client is retrying.
func (c *fpCache) remember(method, endpoint, query, contentType, scope string, body []byte, fp string) {
	if !cacheable(contentType, body) {
		return
	}
	p := c.slot(body)
	s := p.Load()
	if s == nil {
		p.CompareAndSwap(nil, new(fpSlot))
		s = p.Load()
	}
	key := c.key(body)
	s.mu.Lock()
	s.body = append(s.body[:0], key...)
	s.method, s.endpoint, s.query, s.scope, s.fp = method, endpoint, query, scope, fp
	s.mu.Unlock()
}

// cacheable reports whether a body's fingerprint may be cached: JSON (whose
// canonicalisation the cache spares) of at most fpCacheMaxBody bytes.
func cacheable(contentType string, body []byte) bool {
	return len(body) > 0 && len(body) <= fpCacheMaxBody && isJSONMediaType(contentType)
}

// slot returns the slot of body.
func (c *fpCache) slot(body []byte) *atomic.Pointer[fpSlot] {
	c.once.Do(func() {
		c.seed, c.slots = maphash.MakeSeed(), new([fpCacheSlots]atomic.Pointer[fpSlot])
		rand.Read(c.macKey[:])
	})
	return &c.slots[maphash.Bytes(c.seed, body)%fpCacheSlots]
}

// key returns what a slot keeps of body: body itself, or with digest its
// HMAC-SHA256 under the cache's random key. slot must have been called (it
// makes the key). Without digest it allocates nothing: a buffer for the
// digest, passed to the hash's Sum, would escape on every call.
func (c *fpCache) key(body []byte) []byte {
	if !c.digest {
		return body
	}
	h := hmac.New(sha256.New, c.macKey[:])
	h.Write(body)
	return h.Sum(make([]byte, 0, sha256.Size))
}
