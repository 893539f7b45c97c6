package idemmem

import "encoding/binary"

// slabs keeps frozen records in chunks of memory without pointers, each
// record after its length and the hash it is stored under: a store of
// many records is a few hundred objects for the collector, which it
// marks without scanning them. A record freed leaves a hole; a chunk
// that is half holes (and is not the one being filled) is compacted: its
// live records, those the map still refers to, move to the chunk being
// filled, and the chunk is dropped. The caller holds Store.mu.
type slabs struct {
	chunks [][]byte
	holes  []int // bytes freed in each chunk
	spare  []uint32
	last   uint32 // the chunk being filled, when there is one
}

// slabRef is where a frozen record is: chunk<<32 | offset.
type slabRef uint64

// chunkSize is the size of a chunk (larger for a larger record).
const chunkSize = 256 << 10

func (sl *slabs) at(ref slabRef) frozen {
	c := sl.chunks[ref>>32]
	off := int(uint32(ref))
	n, k := binary.Uvarint(c[off:])
	start := off + k + 8
	return frozen(c[start : start+int(n) : start+int(n)])
}

// add stores f under hash h and returns where; done is the map of refs,
// which a compaction this calls for would change.
func (sl *slabs) add(h uint64, f frozen, done map[uint64]slabRef) slabRef {
	var hdr [binary.MaxVarintLen64 + 8]byte
	k := binary.PutUvarint(hdr[:], uint64(len(f)))
	binary.LittleEndian.PutUint64(hdr[k:], h)
	size := k + 8 + len(f)
	if !sl.fits(size) {
		old, had := sl.last, len(sl.chunks) > 0
		sl.last = sl.newChunk(max(chunkSize, size))
		if had {
			sl.compact(old, done) // into the new chunk
		}
		if !sl.fits(size) {
			sl.last = sl.newChunk(max(chunkSize, size))
		}
	}
	c := sl.chunks[sl.last]
	ref := slabRef(uint64(sl.last)<<32 | uint64(len(c)))
	c = append(c, hdr[:k+8]...)
	sl.chunks[sl.last] = append(c, f...)
	return ref
}

// fits reports whether the chunk being filled has room for size bytes.
func (sl *slabs) fits(size int) bool {
	return len(sl.chunks) > 0 && len(sl.chunks[sl.last])+size <= cap(sl.chunks[sl.last])
}

func (sl *slabs) newChunk(size int) uint32 {
	c := make([]byte, 0, size)
	if n := len(sl.spare); n > 0 {
		i := sl.spare[n-1]
		sl.spare = sl.spare[:n-1]
		sl.chunks[i], sl.holes[i] = c, 0
		return i
	}
	sl.chunks = append(sl.chunks, c)
	sl.holes = append(sl.holes, 0)
	return uint32(len(sl.chunks) - 1)
}

// free makes the record at ref a hole, which done no longer refers to.
func (sl *slabs) free(ref slabRef, done map[uint64]slabRef) {
	i := uint32(ref >> 32)
	f := sl.at(ref)
	sl.holes[i] += len(f) + 8 + uvarintLen(uint64(len(f)))
	if i != sl.last {
		sl.compact(i, done)
	}
}

// compact moves the live records of chunk i, when it is half holes, to
// the chunk being filled, and drops it.
func (sl *slabs) compact(i uint32, done map[uint64]slabRef) {
	if sl.holes[i]*2 < len(sl.chunks[i]) {
		return
	}
	c := sl.chunks[i]
	sl.chunks[i] = nil
	for off := 0; off < len(c); {
		n, k := binary.Uvarint(c[off:])
		h := binary.LittleEndian.Uint64(c[off+k:])
		start := off + k + 8
		if ref, ok := done[h]; ok && ref == slabRef(uint64(i)<<32|uint64(off)) { // still live
			done[h] = sl.add(h, frozen(c[start:start+int(n)]), done)
		}
		off = start + int(n)
	}
	sl.holes[i] = 0
	sl.spare = append(sl.spare, i)
}

func uvarintLen(x uint64) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], x)
}
