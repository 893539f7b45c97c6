package idemmem

import (
	"strconv"
	"strings"
	"testing"
)

// TestSlabsCompact fills slabs, frees most of what they hold, and checks
// that every live record reads back, that chunks are at most half holes
// (but the one being filled), and that the chunks given back are used
// again.
func TestSlabsCompact(t *testing.T) {
	t.Parallel()
	var sl slabs
	done := make(map[uint64]slabRef)
	body := func(i uint64) frozen {
		return frozen(strings.Repeat(strconv.FormatUint(i, 10)+",", int(i%200)+1))
	}
	check := func() {
		t.Helper()
		for h, ref := range done {
			if got := sl.at(ref); string(got) != string(body(h)) {
				t.Fatalf("record %d reads %.20q…", h, got)
			}
		}
	}
	const n = 20000
	for i := range uint64(n) {
		done[i] = sl.add(i, body(i), done)
	}
	check()
	for i := range uint64(n) {
		if i%10 != 1 { // keep a tenth; record 0, at offset 0 of chunk 0, goes
			ref := done[i]
			delete(done, i)
			sl.free(ref, done)
		}
		if i%1000 == 0 {
			check()
		}
	}
	check()
	if len(done) != n/10 {
		t.Fatalf("%d records after the frees, want %d: a compaction kept a freed one", len(done), n/10)
	}
	chunks, used := 0, 0
	for _, c := range sl.chunks {
		if c != nil {
			chunks++
			used += len(c)
		}
	}
	live := 0
	for _, ref := range done {
		f := sl.at(ref)
		live += len(f) + 8 + uvarintLen(uint64(len(f)))
	}
	if used > 2*live+chunkSize { // at most half holes, but in the chunk being filled
		t.Errorf("%d chunks of %d bytes hold %d bytes of records", chunks, used, live)
	}
	for i := range uint64(n) {
		done[n+i] = sl.add(n+i, body(n+i), done) // fills the spare chunks again
	}
	check()
	if len(sl.spare) > 0 {
		t.Errorf("%d spare chunks left after adding as much again", len(sl.spare))
	}
}
