package headerjson

import (
	"hash/maphash"
	"net/http"
	"strings"
	"sync/atomic"
)

// Cache decodes as Decode does and keeps the headers it decoded, so that
// the next caller with the same JSON gets the same header back without
// decoding it: a replay of a key, and the responses of an API that sends
// the same headers (most send only a Content-Type), decode nothing. A
// header from a Cache is shared: no caller may change it (a store hands it
// on only where its contract says the caller may not: see
// idemstore.ReserveResult).
//
// A hash of the JSON picks one of a few slots; a miss decodes a copy of
// the JSON and puts it there, in place of the header the slot held. A
// cached header holds no memory of the caller's: its strings are parts of
// that copy. JSON longer than cacheMax is decoded each time, so that the
// slots stay small.
//
// A Cache is safe for concurrent use; its zero value is not ready, use
// NewCache.
type Cache struct {
	seed  maphash.Seed
	slots [64]atomic.Pointer[cached]
}

// cacheMax is the longest JSON a Cache keeps.
const cacheMax = 1 << 10

// cached is a decoded header and the JSON it was decoded from.
type cached struct {
	json   string
	header http.Header
}

// NewCache returns an empty Cache.
func NewCache() *Cache {
	return &Cache{seed: maphash.MakeSeed()}
}

// Decode returns the header json.Unmarshal decodes from s, errors
// included, shared with the Cache's other callers: read-only.
func (c *Cache) Decode(s string) (http.Header, error) {
	if len(s) > cacheMax {
		return Decode(s)
	}
	slot := &c.slots[maphash.String(c.seed, s)%uint64(len(c.slots))]
	if e := slot.Load(); e != nil && e.json == s {
		return e.header, nil
	}
	s = strings.Clone(s)
	h, err := Decode(s)
	if err != nil {
		return nil, err
	}
	slot.Store(&cached{json: s, header: h})
	return h, nil
}
