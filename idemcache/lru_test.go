package idemcache

import (
	"bytes"
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/idem-dev/idem/idemstore"
)

// recordN is a completed record of key-n with a body of size bytes.
func recordN(n, size int) *idemstore.Record {
	r := fullRecord()
	r.Key = fmt.Sprintf("key-%d", n)
	r.Response.Body = bytes.Repeat([]byte{'x'}, size)
	return r
}

// entrySize is what the LRU accounts for r.
func entrySize(r *idemstore.Record) int64 {
	return int64(len(encodeRecord(nil, r))+len(r.Scope)+len(r.Endpoint)+len(r.Key)) + entryOverhead
}

// cached reports which of the keys key-0 … key-(n-1) the LRU holds.
func cached(t *testing.T, c *LRU, n int) []bool {
	t.Helper()
	out := make([]bool, n)
	for i := range n {
		id := recordN(i, 0).Identity
		rec, err := c.Get(context.Background(), id)
		if err != nil {
			t.Fatalf("Get(%s): %v", id.Key, err)
		}
		out[i] = rec != nil
	}
	return out
}

func TestLRUEvictsByCount(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewLRU(3, 0)
	for i := range 3 {
		c.Set(ctx, recordN(i, 10))
	}
	// Touch key-0 so key-1 is the least recently used.
	if rec, _ := c.Get(ctx, recordN(0, 0).Identity); rec == nil {
		t.Fatal("key-0 missing before any eviction")
	}
	c.Set(ctx, recordN(3, 10))
	if c.Len() != 3 {
		t.Fatalf("Len = %d, want 3", c.Len())
	}
	got := cached(t, c, 4)
	want := []bool{true, false, true, true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("cached keys %v, want %v (key-1 evicted)", got, want)
	}
}

func TestLRUEvictsByBytes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	size := entrySize(recordN(0, 1000))
	c := NewLRU(0, 3*size+size/2) // room for three and a half
	for i := range 5 {
		c.Set(ctx, recordN(i, 1000))
		if c.Bytes() > 3*size+size/2 {
			t.Fatalf("after %d sets: %d bytes, over the bound", i+1, c.Bytes())
		}
	}
	if c.Len() != 3 || c.Bytes() != 3*size {
		t.Fatalf("Len %d Bytes %d, want 3 entries of %d bytes", c.Len(), c.Bytes(), size)
	}
	got := cached(t, c, 5)
	want := []bool{false, false, true, true, true}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("cached keys %v, want %v", got, want)
	}

	// One big record evicts as many as it needs.
	big := recordN(9, 2000)
	c.Set(ctx, big)
	if c.Bytes() > 3*size+size/2 {
		t.Fatalf("%d bytes after a big record, over the bound", c.Bytes())
	}
	if rec, _ := c.Get(ctx, big.Identity); rec == nil {
		t.Fatal("the big record is not cached")
	}

	// A record over the whole bound is not cached, and replaces nothing but
	// its own identity's entry.
	huge := recordN(9, int(4*size))
	c.Set(ctx, huge)
	if rec, _ := c.Get(ctx, huge.Identity); rec != nil {
		t.Fatal("a record over maxBytes was cached")
	}
	if c.Len() == 0 {
		t.Fatal("a record over maxBytes evicted everything")
	}
}

func TestLRUReplaceAndDelete(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewLRU(10, 0)
	c.Set(ctx, recordN(1, 10))
	c.Set(ctx, recordN(1, 500))
	if c.Len() != 1 || c.Bytes() != entrySize(recordN(1, 500)) {
		t.Fatalf("Len %d Bytes %d after replacing, want one entry of %d", c.Len(), c.Bytes(), entrySize(recordN(1, 500)))
	}
	rec, err := c.Get(ctx, recordN(1, 0).Identity)
	if err != nil || rec == nil || len(rec.Response.Body) != 500 {
		t.Fatalf("Get after replace = %v, %v; want the 500-byte record", rec, err)
	}
	c.Delete(ctx, rec.Identity)
	c.Delete(ctx, rec.Identity) // deleting a missing entry is fine
	if c.Len() != 0 || c.Bytes() != 0 {
		t.Fatalf("Len %d Bytes %d after delete, want empty", c.Len(), c.Bytes())
	}
}

func TestLRUReturnsCopies(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewLRU(10, 0)
	in := fullRecord()
	c.Set(ctx, in)
	in.Response.Body[0] = '!'
	in.Response.Header["Content-Type"][0] = "text/plain"

	a, _ := c.Get(ctx, in.Identity)
	requireSameRecord(t, a, fullRecord())
	a.Response.Body[0] = '?'
	a.Response.Header.Set("Content-Type", "text/html")
	b, _ := c.Get(ctx, in.Identity)
	requireSameRecord(t, b, fullRecord())
}

func TestLRUDefaultBound(t *testing.T) {
	t.Parallel()
	c := NewLRU(0, 0)
	if c.maxBytes != DefaultLRUBytes {
		t.Fatalf("maxBytes = %d, want DefaultLRUBytes", c.maxBytes)
	}
}

func TestLRUConcurrent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	c := NewLRU(50, 0)
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 500 {
				n := (g*7 + i) % 100
				switch i % 3 {
				case 0:
					c.Set(ctx, recordN(n, n))
				case 1:
					rec, err := c.Get(ctx, recordN(n, 0).Identity)
					if err != nil {
						t.Errorf("Get: %v", err)
						return
					}
					if rec != nil && len(rec.Response.Body) != n {
						t.Errorf("key-%d has a body of %d bytes, want %d", n, len(rec.Response.Body), n)
						return
					}
				case 2:
					c.Delete(ctx, recordN(n, 0).Identity)
				}
			}
		})
	}
	wg.Wait()
	if c.Len() > 50 {
		t.Fatalf("Len = %d over the bound of 50", c.Len())
	}
	var sum int64
	for el := c.order.Front(); el != nil; el = el.Next() {
		sum += el.Value.(*lruEntry).size
	}
	if sum != c.Bytes() || len(c.items) != c.order.Len() {
		t.Fatalf("accounting: Bytes %d, sum of entries %d; %d map entries, %d list entries", c.Bytes(), sum, len(c.items), c.order.Len())
	}
}
