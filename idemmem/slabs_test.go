package idemmem

import (
	"math/rand/v2"
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
	given := len(sl.spare)
	if given == 0 {
		t.Fatalf("no chunk given back after freeing nine records in ten (%d chunks in use)", chunks)
	}
	for i := range uint64(n) {
		done[n+i] = sl.add(n+i, body(n+i), done) // fills the spare chunks again
	}
	check()
	if len(sl.spare) > 0 {
		t.Errorf("%d of the %d chunks given back left spare after adding as much again", len(sl.spare), given)
	}
}

// TestSlabsRandom adds, replaces and frees records of random sizes in
// random order, and checks the slabs against a map of what they should
// hold.
func TestSlabsRandom(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(1, 2))
	var sl slabs
	done := make(map[uint64]slabRef)
	want := make(map[uint64]string)
	for step := range 200000 {
		h := rng.Uint64N(5000)
		if ref, ok := done[h]; ok {
			delete(done, h)
			sl.free(ref, done)
			delete(want, h)
		}
		if rng.IntN(3) > 0 {
			size := rng.IntN(2000)
			if rng.IntN(1000) == 0 {
				size = chunkSize + rng.IntN(1000) // a record larger than a chunk
			}
			body := strings.Repeat(strconv.Itoa(step%10), size)
			done[h] = sl.add(h, frozen(body), done)
			want[h] = body
		}
	}
	if len(done) != len(want) {
		t.Fatalf("%d records, want %d", len(done), len(want))
	}
	live := 0
	for h, body := range want {
		if got := sl.at(done[h]); string(got) != body {
			t.Fatalf("record %d: %d bytes, want %d", h, len(got), len(body))
		}
		live += len(body) + 8 + uvarintLen(uint64(len(body)))
	}
	used := 0
	for i, c := range sl.chunks {
		if uint32(i) != sl.last {
			used += len(c)
		}
	}
	if used > 2*live { // the chunks but the one being filled are at most half holes
		t.Errorf("%d bytes of chunks hold %d bytes of records", used, live)
	}
}
