package idemcache

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/neverstored"
)

// codecVersion is the first byte of every encoded record. A cache entry of
// another version is a miss (the store answers), so a format change needs
// no migration.
const codecVersion = 2

const (
	flagNotReplayable = 1 << iota
	flagResponse
)

// errCorrupt is returned for an entry that does not decode.
var errCorrupt = errors.New("idemcache: corrupt cache entry")

// encodeRecord appends the compact binary form of r to dst: the version,
// then every field as varints and length-prefixed strings, in a fixed order.
func encodeRecord(dst []byte, r *idemstore.Record) []byte {
	dst = append(dst, codecVersion)
	for _, s := range [...]string{
		r.Scope, r.Endpoint, r.Key, r.Fingerprint, string(r.State), r.Token,
		string(r.LeaseExpiredState), r.RecoveryPoint,
	} {
		dst = appendString(dst, s)
	}
	for _, t := range [...]time.Time{r.LockedUntil, r.StartedAt, r.CreatedAt, r.UpdatedAt, r.ExpiresAt} {
		dst = binary.AppendVarint(dst, t.Unix())
		dst = binary.AppendUvarint(dst, uint64(t.Nanosecond()))
	}
	dst = binary.AppendVarint(dst, int64(r.Attempts))
	// Version 2: the retention and the reconciliation state.
	dst = binary.AppendVarint(dst, int64(r.TTL))
	dst = binary.AppendVarint(dst, r.ReconcileAfter.Unix())
	dst = binary.AppendUvarint(dst, uint64(r.ReconcileAfter.Nanosecond()))
	dst = binary.AppendVarint(dst, int64(r.ReconcileAttempts))
	dst = appendString(dst, r.ReconcileError)
	var flags byte
	if r.NotReplayable {
		flags |= flagNotReplayable
	}
	if r.Response != nil {
		flags |= flagResponse
	}
	dst = append(dst, flags)
	if r.Response == nil {
		return dst
	}
	dst = binary.AppendVarint(dst, int64(r.Response.Status))
	// A sealed response's seal travels as the stores keep it, as a header.
	header := neverstored.Pack(r.Response.Header, r.Response.Sealed)
	// Sorted names, so equal records encode equally.
	names := make([]string, 0, len(header))
	for name := range header {
		names = append(names, name)
	}
	slices.Sort(names)
	dst = binary.AppendUvarint(dst, uint64(len(names)))
	for _, name := range names {
		vs := header[name]
		dst = appendString(dst, name)
		dst = binary.AppendUvarint(dst, uint64(len(vs)))
		for _, v := range vs {
			dst = appendString(dst, v)
		}
	}
	return appendBytes(dst, r.Response.Body)
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func appendBytes(dst, b []byte) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(b)))
	return append(dst, b...)
}

// decodeRecord parses what encodeRecord wrote. The record shares no memory
// with b.
func decodeRecord(b []byte) (*idemstore.Record, error) {
	d := decoder{b: b}
	if v := d.byte(); v != codecVersion {
		if d.err != nil {
			return nil, d.err
		}
		return nil, fmt.Errorf("%w: format version %d, want %d", errCorrupt, v, codecVersion)
	}
	r := &idemstore.Record{}
	for _, s := range [...]*string{&r.Scope, &r.Endpoint, &r.Key, &r.Fingerprint} {
		*s = d.string()
	}
	r.State = idemstore.State(d.string())
	r.Token = d.string()
	r.LeaseExpiredState = idemstore.State(d.string())
	r.RecoveryPoint = d.string()
	for _, t := range [...]*time.Time{&r.LockedUntil, &r.StartedAt, &r.CreatedAt, &r.UpdatedAt, &r.ExpiresAt} {
		*t = d.time()
	}
	r.Attempts = int(d.varint())
	r.TTL = time.Duration(d.varint())
	r.ReconcileAfter = d.time()
	r.ReconcileAttempts = int(d.varint())
	r.ReconcileError = d.string()
	flags := d.byte()
	r.NotReplayable = flags&flagNotReplayable != 0
	if flags&flagResponse != 0 {
		resp := &idemstore.Response{Status: int(d.varint())}
		if n := d.count(); n > 0 {
			resp.Header = make(http.Header, n)
			for range n {
				name := d.string()
				vs := make([]string, d.count())
				for i := range vs {
					vs[i] = d.string()
				}
				resp.Header[name] = vs
			}
			resp.Header, resp.Sealed = neverstored.Unpack(resp.Header)
		}
		resp.Body = d.bytes()
		r.Response = resp
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%w: %d trailing bytes", errCorrupt, len(d.b))
	}
	if d.err != nil {
		return nil, d.err
	}
	return r, nil
}

// decoder reads an encoded record; its first error sticks and every later
// read returns zero values.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(what string) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: truncated or invalid %s", errCorrupt, what)
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail("byte")
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail("uvarint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.fail("varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// count reads a length that must fit in the rest of the input (each item
// takes at least one byte), so a corrupt count cannot make a huge
// allocation.
func (d *decoder) count() int {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("count")
		return 0
	}
	return int(n)
}

func (d *decoder) raw() []byte {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail("length")
		return nil
	}
	v := d.b[:n]
	d.b = d.b[n:]
	return v
}

func (d *decoder) string() string { return string(d.raw()) }

func (d *decoder) bytes() []byte {
	v := d.raw()
	if len(v) == 0 {
		return nil
	}
	return slices.Clone(v)
}

func (d *decoder) time() time.Time {
	sec := d.varint()
	nsec := d.uvarint()
	if nsec >= uint64(time.Second) {
		d.fail("time")
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec)).UTC()
}
