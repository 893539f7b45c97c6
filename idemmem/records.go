package idemmem

import (
	"hash/maphash"
	"iter"

	"github.com/idem-dev/idem/idemstore"
)

// recordMap holds the stored records by identity. The completed ones are
// frozen (see frozen) in slabs, found through a map keyed by a hash of the
// identity whose values are where in the slabs: neither holds a pointer,
// so the garbage collector scans neither. The others, which change, are
// records in a second map of the same keys, whose records of one hash are
// chained through record.next. The hash decides nothing: a lookup compares
// identities. (A map keyed by the identity itself keeps the three strings
// again in each slot, pointers that the collector follows on every cycle
// for every record, in a store of many.) A completed record whose hash a
// frozen record of another identity has already (two identities of one
// 64-bit hash: never seen, but possible) stays a record. The caller holds
// Store.mu.
type recordMap struct {
	seed    maphash.Seed
	m       map[uint64]*record
	done    map[uint64]slabRef
	slabs   slabs
	headers headerTable // the frozen records' headers, shared
	scratch []byte      // where put encodes a record, before slabs keeps it
}

func newRecordMap() recordMap {
	return recordMap{seed: maphash.MakeSeed(), m: make(map[uint64]*record), done: make(map[uint64]slabRef)}
}

func (rm *recordMap) hash(id idemstore.Identity) uint64 {
	return maphash.Comparable(rm.seed, id) // the map's own hash of the identity
}

// frozenOf returns the frozen record of id, if id has one (valid until
// rm next changes), and the hash of id.
func (rm *recordMap) frozenOf(id idemstore.Identity) (frozen, uint64, bool) {
	h := rm.hash(id)
	if ref, ok := rm.done[h]; ok {
		if f := rm.slabs.at(ref); f.is(id) {
			return f, h, true
		}
	}
	return nil, h, false
}

// unfreeze removes the frozen record of hash h, if it is id's.
func (rm *recordMap) unfreeze(h uint64, id idemstore.Identity) bool {
	ref, ok := rm.done[h]
	if !ok || !rm.slabs.at(ref).is(id) {
		return false
	}
	delete(rm.done, h)
	rm.slabs.free(ref, rm.done)
	return true
}

// get returns the record of id, or nil. A frozen one is thawed: a copy,
// which changes nothing stored (nothing changes a completed record).
func (rm *recordMap) get(id idemstore.Identity) *record {
	f, h, ok := rm.frozenOf(id)
	if ok {
		return f.thaw(&rm.headers)
	}
	for r := rm.m[h]; r != nil; r = r.next {
		if r.Identity == id {
			return r
		}
	}
	return nil
}

// put stores r, in place of the record of its identity if there is one;
// a completed r is frozen, and r itself is not kept then: put reports
// whether it was.
func (rm *recordMap) put(r *record) bool {
	h := rm.hash(r.Identity)
	rm.unfreeze(h, r.Identity)
	rm.unchain(h, r.Identity)
	if _, taken := rm.done[h]; r.State == idemstore.StateCompleted && !taken {
		rm.scratch = freeze(rm.scratch[:0], &r.Record, &rm.headers)
		rm.done[h] = rm.slabs.add(h, rm.scratch, rm.done)
		return true
	}
	r.next = rm.m[h]
	rm.m[h] = r
	return false
}

// del removes the record of id, if there is one.
func (rm *recordMap) del(id idemstore.Identity) {
	h := rm.hash(id)
	if !rm.unfreeze(h, id) {
		rm.unchain(h, id)
	}
}

// unchain removes the record of id from the chain of hash h.
func (rm *recordMap) unchain(h uint64, id idemstore.Identity) {
	head := rm.m[h]
	for p := &head; *p != nil; p = &(*p).next {
		if (*p).Identity == id {
			*p = (*p).next
			if head == nil {
				delete(rm.m, h)
			} else {
				rm.m[h] = head
			}
			return
		}
	}
}

// changing yields every stored record that is not frozen: all those
// that may be in progress or unknown. The caller may del the record it is
// given, but not others.
func (rm *recordMap) changing() iter.Seq[*record] {
	return func(yield func(*record) bool) {
		for _, head := range rm.m {
			for r := head; r != nil; {
				next := r.next
				if !yield(r) {
					return
				}
				r = next
			}
		}
	}
}

// all yields every stored record, the frozen ones thawed (copies). The
// caller may del the record it is given, but not others.
func (rm *recordMap) all() iter.Seq[*record] {
	return func(yield func(*record) bool) {
		for r := range rm.changing() {
			if !yield(r) {
				return
			}
		}
		for f := range rm.frozen() {
			if !yield(f.thaw(&rm.headers)) {
				return
			}
		}
	}
}

// frozen yields every frozen record, valid until rm next changes.
func (rm *recordMap) frozen() iter.Seq[frozen] {
	return func(yield func(frozen) bool) {
		for _, ref := range rm.done {
			if !yield(rm.slabs.at(ref)) {
				return
			}
		}
	}
}
