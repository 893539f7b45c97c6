package idemcache

import (
	"container/list"
	"context"
	"sync"

	"github.com/idem-dev/idem/idemstore"
)

// DefaultLRUBytes bounds an LRU that NewLRU was given no bound for.
const DefaultLRUBytes = 64 << 20

// entryOverhead approximates the memory of an LRU entry beyond its encoded
// record and identity: the map slot, the list element and the entry struct.
const entryOverhead = 160

// LRU is a Cache in process memory, bounded by a number of entries and a
// number of bytes, evicting the least recently used entry first. Records are
// kept encoded, so a Get returns a fresh copy and the byte count is the real
// size of the data. It is safe for concurrent use.
//
// An LRU is private to its process: with several app nodes each has its own,
// which is correct (a completed record is the same everywhere) but fills once
// per node.
type LRU struct {
	maxEntries int
	maxBytes   int64

	mu    sync.Mutex
	bytes int64
	order *list.List // of *lruEntry, most recently used first
	items map[idemstore.Identity]*list.Element
}

type lruEntry struct {
	id   idemstore.Identity
	data []byte // the encoded record; never modified once stored
	size int64
}

var _ Cache = (*LRU)(nil)

// NewLRU returns an empty LRU holding at most maxEntries records and at most
// maxBytes bytes (encoded records plus a small per-entry overhead). A bound
// of zero or less is no bound; when both are, maxBytes is DefaultLRUBytes.
// A record larger than maxBytes is never cached.
func NewLRU(maxEntries int, maxBytes int64) *LRU {
	if maxEntries <= 0 && maxBytes <= 0 {
		maxBytes = DefaultLRUBytes
	}
	return &LRU{
		maxEntries: maxEntries,
		maxBytes:   maxBytes,
		order:      list.New(),
		items:      make(map[idemstore.Identity]*list.Element),
	}
}

// Get returns a copy of the cached record of id, or nil.
func (c *LRU) Get(_ context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	c.mu.Lock()
	el := c.items[id]
	if el == nil {
		c.mu.Unlock()
		return nil, nil
	}
	c.order.MoveToFront(el)
	data := el.Value.(*lruEntry).data
	c.mu.Unlock()
	return decodeRecord(data)
}

// Set caches rec, replacing the entry of its identity and evicting the least
// recently used entries beyond the bounds.
func (c *LRU) Set(_ context.Context, rec *idemstore.Record) error {
	data := encodeRecord(nil, rec)
	e := &lruEntry{id: rec.Identity, data: data}
	e.size = int64(len(data)+len(e.id.Scope)+len(e.id.Endpoint)+len(e.id.Key)) + entryOverhead

	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.items[e.id]; el != nil {
		c.remove(el)
	}
	if c.maxBytes > 0 && e.size > c.maxBytes {
		return nil
	}
	c.items[e.id] = c.order.PushFront(e)
	c.bytes += e.size
	for c.over() {
		c.remove(c.order.Back())
	}
	return nil
}

// over reports whether the cache holds more than its bounds. The caller
// holds c.mu.
func (c *LRU) over() bool {
	return (c.maxEntries > 0 && c.order.Len() > c.maxEntries) ||
		(c.maxBytes > 0 && c.bytes > c.maxBytes)
}

// remove drops an entry. The caller holds c.mu.
func (c *LRU) remove(el *list.Element) {
	e := c.order.Remove(el).(*lruEntry)
	delete(c.items, e.id)
	c.bytes -= e.size
}

// Delete removes the cached record of id.
func (c *LRU) Delete(_ context.Context, id idemstore.Identity) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if el := c.items[id]; el != nil {
		c.remove(el)
	}
	return nil
}

// Len returns the number of cached records.
func (c *LRU) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.order.Len()
}

// Bytes returns the bytes the cached records account for.
func (c *LRU) Bytes() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.bytes
}
