package idemmem

import (
	"hash/maphash"
	"iter"

	"github.com/idem-dev/idem/idemstore"
)

// recordMap holds the stored records by identity. It is a map keyed by a
// hash of the identity, whose records of one hash are chained through
// record.next (the hash decides nothing: a lookup compares identities). A
// map keyed by the identity itself keeps the three strings again in each
// slot, pointers that the garbage collector follows on every cycle for
// every record, in a store of many; a hash is no pointer, and the record
// has the strings. The caller holds Store.mu.
type recordMap struct {
	seed maphash.Seed
	m    map[uint64]*record
}

func newRecordMap() recordMap {
	return recordMap{seed: maphash.MakeSeed(), m: make(map[uint64]*record)}
}

func (rm *recordMap) hash(id idemstore.Identity) uint64 {
	return maphash.Comparable(rm.seed, id) // the map's own hash of the identity
}

// get returns the record of id, or nil.
func (rm *recordMap) get(id idemstore.Identity) *record {
	for r := rm.m[rm.hash(id)]; r != nil; r = r.next {
		if r.Identity == id {
			return r
		}
	}
	return nil
}

// put stores r, in place of the record of its identity if there is one.
func (rm *recordMap) put(r *record) {
	h := rm.hash(r.Identity)
	head := rm.m[h]
	r.next = nil
	for p := &head; *p != nil; p = &(*p).next {
		if (*p).Identity == r.Identity {
			r.next = (*p).next
			*p = r
			rm.m[h] = head
			return
		}
	}
	r.next = head
	rm.m[h] = r
}

// del removes the record of id, if there is one.
func (rm *recordMap) del(id idemstore.Identity) {
	h := rm.hash(id)
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

// all yields every stored record. The caller may del the record it is
// given, but not others.
func (rm *recordMap) all() iter.Seq[*record] {
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
