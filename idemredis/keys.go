package idemredis

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/idem-dev/idem/idemstore"
)

// bucketCount is the number of lease indexes (and hash tags). It is
// part of the key layout: changing it strands existing records.
const bucketCount = 1024

// keyCache remembers the keys of recently named records: a request names
// its record at least twice (reserve, then complete or release), a retry
// names it again, and building the names costs a SHA-256 and an
// allocation. A slot holds one identity; another identity that hashes to
// the same slot replaces it.
//
// A slot also remembers the record as this store last inserted it for the
// identity (see written): what KeyComplete expects to find there; and
// whether this store last saw the record completed (see doneUntil): a
// reservation of it then reads it with a plain GET before it runs
// reserve.lua (see Store.replay). Both are only guesses, checked against
// what is stored before anything relies on them.
type keyCache struct {
	seed  maphash.Seed
	slots [1024]keySlot
}

type keySlot struct {
	mu   sync.Mutex
	id   idemstore.Identity
	keys recordKeys
	// written is the record as a reservation of this store wrote it for
	// id, or "".
	written string
	// doneUntil is the expires_at (Unix microseconds) of the record of id
	// when this store last saw it completed (it completed it, or a
	// reservation found it so), or 0.
	doneUntil int64
	// replayed is the record as stored that Store.replay last answered
	// for id, and replay its answer, when it is at most maxKeptReplay
	// bytes long; or "" and nil.
	replayed string
	replay   *idemstore.ReserveResult
}

// maxKeptReplay bounds the records a keySlot keeps decoded (keySlot.replay):
// the slots then hold at most a few MiB, the record and its decoded body.
const maxKeptReplay = 2048

func (c *keyCache) slot(id idemstore.Identity) *keySlot {
	return &c.slots[maphash.String(c.seed, id.Key)%uint64(len(c.slots))]
}

// setWritten remembers v as the record a reservation wrote for id, when
// id holds its slot: a record in progress, not completed.
func (c *keyCache) setWritten(id idemstore.Identity, v string) {
	slot := c.slot(id)
	slot.mu.Lock()
	if slot.id == id {
		slot.written, slot.doneUntil = v, 0
		slot.replayed, slot.replay = "", nil
	}
	slot.mu.Unlock()
}

// setReplay remembers res as the answer of a replay of id that read v,
// when id holds its slot and v is short enough to keep.
func (c *keyCache) setReplay(id idemstore.Identity, v string, res *idemstore.ReserveResult) {
	if len(v) > maxKeptReplay {
		return
	}
	slot := c.slot(id)
	slot.mu.Lock()
	if slot.id == id {
		slot.replayed, slot.replay = v, res
	}
	slot.mu.Unlock()
}

// lastReplay returns the answer setReplay remembered for id when it read
// v, or nil.
func (c *keyCache) lastReplay(id idemstore.Identity, v string) *idemstore.ReserveResult {
	slot := c.slot(id)
	slot.mu.Lock()
	var res *idemstore.ReserveResult
	if slot.id == id && slot.replayed == v {
		res = slot.replay
	}
	slot.mu.Unlock()
	return res
}

// setDone remembers that the record of id was completed, retained until
// expiresAt (Unix microseconds; 0 to forget it), when id holds its slot.
func (c *keyCache) setDone(id idemstore.Identity, expiresAt int64) {
	slot := c.slot(id)
	slot.mu.Lock()
	if slot.id == id {
		slot.doneUntil = expiresAt
	}
	slot.mu.Unlock()
}

// takeWritten returns the record a reservation wrote for id and forgets
// it, or "". It is only a guess of what is stored: the scripts compare it
// with the record before they rely on it.
func (c *keyCache) takeWritten(id idemstore.Identity) string {
	slot := c.slot(id)
	slot.mu.Lock()
	var v string
	if slot.id == id {
		v, slot.written = slot.written, ""
	}
	slot.mu.Unlock()
	return v
}

// recordKeys are the names of one record's keys and channel.
type recordKeys struct {
	record  string // the hash
	index   string // the lease index of its bucket
	expiry  string // the expiry index of its bucket
	member  string // its member in the lease index
	channel string // its pub/sub channel
	// unknown is the backlog index of its bucket: the unknown records
	// scored by when they turned unknown; reconcile is the reconcile index:
	// the same records scored by reconcile_after.
	unknown, reconcile string
	// boxed are the same names boxed once as script arguments; keysOf
	// sets them, bucketKeys does not.
	boxed *boxedKeys
}

// boxedKeys are a record's names as script arguments (see args.go): the
// keys of a new key's scripts (reserve.lua and complete.lua) boxed once,
// the others boxed by the calls that take them (each box is an allocation,
// and most records are named for a new key and its completion only).
type boxedKeys struct {
	record, index, expiry any    // the keys of every script
	unknown, reconcile    string // the keys of some
	member, channel       string // arguments of some
}

// box returns k's names boxed.
func (k recordKeys) box() *boxedKeys {
	return &boxedKeys{record: k.record, index: k.index, expiry: k.expiry,
		unknown: k.unknown, reconcile: k.reconcile, member: k.member, channel: k.channel}
}

// all returns the five keys of a script that takes them all, in
// record_keys order (lua/lib.lua).
func (k recordKeys) all() []string {
	return []string{k.record, k.index, k.expiry, k.unknown, k.reconcile}
}

// keysOf returns the keys of the record named id.
func (s *Store) keysOf(id idemstore.Identity) recordKeys {
	k, _ := s.lookupKeys(id)
	return k
}

// lookupKeys returns the keys of the record named id, and its doneUntil
// (see keySlot).
func (s *Store) lookupKeys(id idemstore.Identity) (recordKeys, int64) {
	slot := s.keys.slot(id)
	slot.mu.Lock()
	hit, k, done := slot.id == id && slot.keys.record != "", slot.keys, slot.doneUntil
	slot.mu.Unlock()
	if hit {
		return k, done
	}
	k = s.newKeys(id)
	slot.mu.Lock()
	slot.id, slot.keys, slot.written, slot.doneUntil = id, k, "", 0
	slot.replayed, slot.replay = "", nil
	slot.mu.Unlock()
	return k, 0
}

// newKeys builds the keys of the record named id.
func (s *Store) newKeys(id idemstore.Identity) recordKeys {
	// The hash input is each field's length (8 bytes, big endian) then its
	// bytes; it is built in one buffer, on the stack when small.
	var stack [256]byte
	buf := stack[:0]
	for _, f := range [...]string{id.Scope, id.Endpoint, id.Key} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	sum := sha256.Sum256(buf)
	bucket := int(binary.BigEndian.Uint16(sum[:])) % bucketCount
	var member [2 * sha256.Size]byte
	hex.Encode(member[:], sum[:])
	k := s.keysFor(bucket, member[:])
	k.boxed = k.box()
	return k
}

// bucketKeys returns the keys of the record member of bucket.
func (s *Store) bucketKeys(bucket int, member string) recordKeys {
	return s.keysFor(bucket, []byte(member))
}

// keysFor builds the keys of the record member of bucket in one string and
// slices them out of it: one allocation for all of them.
func (s *Store) keysFor(bucket int, member []byte) recordKeys {
	tag := len(s.prefix) + len("{xxx}")
	rec := tag + len(":r:") + len(member)
	idx := tag + len(":leases")
	exp := tag + len(":expiry")
	unk := tag + len(":unknown")
	rcn := tag + len(":reconcile")
	ch := tag + len(":c:") + len(member)
	var b strings.Builder
	b.Grow(rec + idx + exp + ch + unk + rcn)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":r:")
	b.Write(member)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":leases")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":expiry")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":c:")
	b.Write(member)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":unknown")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":reconcile")
	all := b.String()
	o := rec + idx + exp
	return recordKeys{
		record:    all[:rec],
		member:    all[tag+len(":r:") : rec],
		index:     all[rec : rec+idx],
		expiry:    all[rec+idx : o],
		channel:   all[o : o+ch],
		unknown:   all[o+ch : o+ch+unk],
		reconcile: all[o+ch+unk:],
	}
}

func (s *Store) bucketTag(bucket int) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + len("{xxx}"))
	s.writeBucketTag(&b, bucket)
	return b.String()
}

// writeBucketTag writes prefix{xxx}, bucket as three lowercase hex digits
// (as %03x formats it below 4096).
func (s *Store) writeBucketTag(b *strings.Builder, bucket int) {
	const digits = "0123456789abcdef"
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteByte(digits[bucket>>8&0xf])
	b.WriteByte(digits[bucket>>4&0xf])
	b.WriteByte(digits[bucket&0xf])
	b.WriteByte('}')
}

// escapeGlob quotes the characters SCAN MATCH treats as special.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
