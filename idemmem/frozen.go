package idemmem

import (
	"encoding/binary"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// frozen is a completed record encoded in bytes, as the store keeps it
// (in the chunks of its slabs): bytes hold no pointer, so the garbage
// collector does not scan them, where a record and its response hold a
// dozen pointers (strings, times' locations, the header, the body) that
// every cycle follows for every record. In a store of many completed
// records (a proxy's, after a while of new keys) that marking was a fifth
// of a replay's CPU (BenchmarkProxy/replay-200k). Nothing changes a
// completed record in place (it is replaced or deleted), so neither does
// anything change a frozen one. A frozen record read from slabs is valid
// until the slabs next change.
//
// The encoding: the expiry (seconds and nanoseconds since 1970, for
// expired without decoding the rest), then the identity (so that a lookup
// compares it first), then the other fields in the order freeze writes
// them: strings prefixed by their uvarint length, integers as varints,
// times in their binary form (time.Time.AppendBinary: the instant and the
// zone offset; the monotonic reading is dropped, so a frozen record's
// times compare by the wall clock, as a database's do), the header in the
// form of appendHeaderKey, and the body last.
type frozen []byte

// Flags of a frozen record.
const (
	frozenNotReplayable = 1 << iota
	frozenResponse      // Record.Response is not nil
	frozenHeader        // Response.Header is not nil
)

// freeze appends the encoding of r, a completed record, to b, with its
// response's header in t.
func freeze(b []byte, r *idemstore.Record, t *headerTable) frozen {
	b = slices.Grow(b, frozenSize(r))
	b = binary.LittleEndian.AppendUint64(b, uint64(r.ExpiresAt.Unix()))
	b = binary.LittleEndian.AppendUint32(b, uint32(r.ExpiresAt.Nanosecond()))
	for _, s := range [...]string{r.Scope, r.Endpoint, r.Key, r.Fingerprint, string(r.State), r.Token,
		string(r.LeaseExpiredState), r.RecoveryPoint, r.ReconcileError} {
		b = appendBytes(b, s)
	}
	for _, tm := range [...]time.Time{r.LockedUntil, r.StartedAt, r.CreatedAt, r.UpdatedAt, r.ExpiresAt, r.ReconcileAfter} {
		b = appendTime(b, tm)
	}
	b = binary.AppendVarint(b, int64(r.Attempts))
	b = binary.AppendVarint(b, int64(r.TTL))
	b = binary.AppendVarint(b, int64(r.ReconcileAttempts))
	var flags byte
	if r.NotReplayable {
		flags |= frozenNotReplayable
	}
	resp := r.Response
	if resp == nil {
		return append(b, flags)
	}
	flags |= frozenResponse
	if resp.Header != nil {
		flags |= frozenHeader
		t.intern(resp.Header) // so that thaw finds it to share
	}
	b = append(b, flags)
	b = binary.AppendVarint(b, int64(resp.Status))
	b = appendBytes(b, resp.Sealed)
	var buf [256]byte
	key := appendHeaderKey(buf[:0], resp.Header)
	b = binary.AppendUvarint(b, uint64(len(key)))
	b = append(b, key...)
	return append(b, resp.Body...)
}

// frozenSize is about the length of r's encoding, for one allocation.
func frozenSize(r *idemstore.Record) int {
	n := 12 + 9*2 + 6*17 + 3*10 + 1 + len(r.Scope) + len(r.Endpoint) + len(r.Key) + len(r.Fingerprint) +
		len(r.State) + len(r.Token) + len(r.LeaseExpiredState) + len(r.RecoveryPoint) + len(r.ReconcileError)
	if resp := r.Response; resp != nil {
		n += 10 + 2 + len(resp.Sealed) + len(resp.Body) + 3
		for name, vs := range resp.Header {
			n += 8 + len(name)
			for _, v := range vs {
				n += 4 + len(v)
			}
		}
	}
	return n
}

func appendBytes(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendTime(b []byte, tm time.Time) []byte {
	n := len(b)
	b = append(b, 0) // the length, once known
	b, err := tm.AppendBinary(b)
	if err != nil {
		// A zone offset that is not a whole minute before 1900, or a year
		// out of range: keep the instant in UTC.
		b, _ = tm.UTC().AppendBinary(b[:n+1])
	}
	b[n] = byte(len(b) - n - 1)
	return b
}

// expired is idemstore.Record.Expired of the record: a completed record
// is expired from its ExpiresAt on.
func (f frozen) expired(now time.Time) bool {
	return !now.Before(f.expiresAt())
}

func (f frozen) expiresAt() time.Time {
	return time.Unix(int64(binary.LittleEndian.Uint64(f[:8])), int64(binary.LittleEndian.Uint32(f[8:12])))
}

// is reports whether the record's identity is id, without decoding it.
// A replay asks it of the record its identity's hash found: the three
// strings are compared in turn, without building an array of them (a third
// of the cost of a replay's lookup when they were).
func (f frozen) is(id idemstore.Identity) bool {
	b, ok := cutString(f[12:], id.Scope)
	if ok {
		b, ok = cutString(b, id.Endpoint)
	}
	if ok {
		_, ok = cutString(b, id.Key)
	}
	return ok
}

// cutString reports whether b starts with appendBytes's encoding of s, and
// returns the rest of b after it.
func cutString(b []byte, s string) ([]byte, bool) {
	n, k := uint64(0), 0
	if len(b) > 0 && b[0] < 0x80 { // a length below 128: one byte
		n, k = uint64(b[0]), 1
	} else {
		n, k = binary.Uvarint(b)
	}
	if k <= 0 || uint64(len(s)) != n || string(b[k:k+len(s)]) != s {
		return nil, false
	}
	return b[k+len(s):], true
}

// identity is the record's identity.
func (f frozen) identity() idemstore.Identity {
	d := decoder{s: string(f), i: 12}
	return idemstore.Identity{Scope: d.str(), Endpoint: d.str(), Key: d.str()}
}

// thaw decodes f into a new record, whose strings are parts of one copy
// of f, and whose header is t's when t has it: with a nil t, the record
// shares nothing with the store.
func (f frozen) thaw(t *headerTable) *record {
	return thaw(string(f), t)
}

// thaw decodes the frozen record s (a copy) into a new record, whose
// strings are parts of s.
func thaw(s string, t *headerTable) *record {
	n := new(record)
	r := &n.Record
	d := decoder{s: s, i: 12}
	r.Scope, r.Endpoint, r.Key, r.Fingerprint = d.str(), d.str(), d.str(), d.str()
	r.State, r.Token = idemstore.State(d.str()), d.str()
	r.LeaseExpiredState, r.RecoveryPoint, r.ReconcileError = idemstore.State(d.str()), d.str(), d.str()
	r.LockedUntil, r.StartedAt, r.CreatedAt, r.UpdatedAt, r.ExpiresAt, r.ReconcileAfter = d.time(), d.time(), d.time(), d.time(), d.time(), d.time()
	r.Attempts, r.TTL, r.ReconcileAttempts = int(d.varint()), time.Duration(d.varint()), int(d.varint())
	flags := d.byte()
	r.NotReplayable = flags&frozenNotReplayable != 0
	if flags&frozenResponse == 0 {
		return n
	}
	n.response.Status = int(d.varint())
	n.response.Sealed = d.str()
	if key := d.str(); flags&frozenHeader != 0 {
		if t != nil {
			n.response.Header = t.sets[key]
		}
		if n.response.Header == nil {
			n.response.Header = parseHeaderKey(key)
		}
	}
	if rest := d.s[d.i:]; rest != "" {
		n.response.Body = []byte(rest)
	}
	r.Response = &n.response
	return n
}

// decoder reads a frozen record from s[i:]. The encoding is the store's
// own: a malformed one is a bug, and panics.
type decoder struct {
	s string
	i int
}

func (d *decoder) byte() byte {
	c := d.s[d.i]
	d.i++
	return c
}

func (d *decoder) uvarint() uint64 {
	var x uint64
	for shift := 0; ; shift += 7 {
		c := d.byte()
		x |= uint64(c&0x7f) << shift
		if c < 0x80 {
			return x
		}
	}
}

func (d *decoder) varint() int64 {
	u := d.uvarint()
	x := int64(u >> 1)
	if u&1 != 0 {
		x = ^x
	}
	return x
}

func (d *decoder) str() string {
	n := int(d.uvarint())
	s := d.s[d.i : d.i+n]
	d.i += n
	return s
}

func (d *decoder) time() time.Time {
	n := int(d.byte())
	var tm time.Time
	if err := tm.UnmarshalBinary([]byte(d.s[d.i : d.i+n])); err != nil {
		panic("idemmem: a frozen record's time: " + err.Error())
	}
	d.i += n
	return tm
}

// parseHeaderKey decodes appendHeaderKey's encoding of a header.
func parseHeaderKey(key string) http.Header {
	h := make(http.Header)
	d := decoder{s: key}
	for d.i < len(d.s) {
		name := d.lengthPrefixed(':')
		n := d.count('#')
		vs := make([]string, n)
		for i := range vs {
			vs[i] = d.lengthPrefixed(':')
		}
		h[name] = vs
	}
	return h
}

// count reads a decimal number ended by end.
func (d *decoder) count(end byte) int {
	j := d.i
	for d.s[j] != end {
		j++
	}
	n, err := strconv.Atoi(d.s[d.i:j])
	if err != nil {
		panic("idemmem: a frozen record's header: " + err.Error())
	}
	d.i = j + 1
	return n
}

// lengthPrefixed reads appendString's encoding of a string.
func (d *decoder) lengthPrefixed(end byte) string {
	n := d.count(end)
	s := d.s[d.i : d.i+n]
	d.i += n
	return s
}
