package idemcrypt

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
)

// The formats of a sealed response. Both open; Seal writes formatV2.
//
//   - v1 authenticates the record's identity, the status and the key name.
//   - v2 also authenticates the record's fingerprint and creation time, so
//     an answer saved from an earlier record of the same identity (another
//     request, or the same request before the record expired) does not open
//     on a later one.
const (
	formatV1 = "v1"
	formatV2 = "v2"
)

var (
	// ErrUnknownKey is returned when a record is sealed under a key the
	// keyring does not hold (or there is no keyring). The error is a
	// *KeyError naming the key.
	ErrUnknownKey = errors.New("idemcrypt: the response is sealed under a key the keyring does not hold")
	// ErrOpen is returned when a sealed response does not open under its
	// key: it was sealed for another record (moved ciphertext, or an answer
	// saved from an earlier record of the same key), altered, or the key of
	// that name holds other material. The error is a *KeyError.
	ErrOpen = errors.New("idemcrypt: the sealed response does not open (altered, moved from another record, or another key of the same name)")
	// ErrNotSealed is returned, when encryption is required
	// (Config.Required), for a stored response that is not sealed, or that
	// is sealed in format v1, which does not bind it to the record's
	// fingerprint and creation time. Anyone who can write to the store can
	// plant such a response; rotation (Rotate) seals every legitimate one.
	ErrNotSealed = errors.New("idemcrypt: the stored response is not sealed in the current format, and encryption is required")
)

// KeyError is an error opening a sealed response: Err (ErrUnknownKey or
// ErrOpen) with the name of the key the record names. It never holds key
// material or any of the response.
type KeyError struct {
	Name string
	Err  error
}

// Error returns Err's text with the key's name.
func (e *KeyError) Error() string { return fmt.Sprintf("%v (key %q)", e.Err, e.Name) }

// Unwrap returns Err.
func (e *KeyError) Unwrap() error { return e.Err }

// Binding is what a sealed response is bound to: the record's identity,
// fingerprint and creation time, all of which the store keeps in the clear.
// A response sealed for one binding opens for that binding only.
type Binding struct {
	idemstore.Identity
	Fingerprint string
	CreatedAt   time.Time
}

// BindingOf returns the binding of rec: its identity, fingerprint and
// creation time.
func BindingOf(rec *idemstore.Record) Binding {
	return Binding{Identity: rec.Identity, Fingerprint: rec.Fingerprint, CreatedAt: rec.CreatedAt}
}

// SealedBy returns the name of the key that sealed resp, and whether resp is
// sealed at all (in any format). A nil response is not sealed.
func SealedBy(resp *idemstore.Response) (name string, sealed bool) {
	_, name, sealed = sealedFormat(resp)
	return name, sealed
}

// sealedFormat returns the format and the key name of a sealed response
// (idemstore.Response.Sealed: "v2 NAME").
func sealedFormat(resp *idemstore.Response) (format, name string, sealed bool) {
	if resp == nil || resp.Sealed == "" {
		return "", "", false
	}
	format, name, ok := strings.Cut(resp.Sealed, " ")
	if !ok || (format != formatV1 && format != formatV2) || validName(name) != nil {
		return "", "", false
	}
	return format, name, true
}

// current reports whether resp is sealed in the format Seal writes.
func current(resp *idemstore.Response) bool {
	format, _, sealed := sealedFormat(resp)
	return sealed && format == formatV2
}

// Seal returns resp sealed for the record b under the keyring's first key:
// the same Status (stored in the clear), no header, Sealed naming the format
// and the key, and
// a body of a random 12-byte nonce followed by the AES-256-GCM encryption
// of the headers and the body. The additional authenticated data is b (the
// record's identity, fingerprint and creation time), the status and the key
// name, so a sealed response opens for its own record only: not on another
// key, tenant or endpoint, and not on a later record of the same identity.
// A nil resp is returned as nil. resp is not modified.
func (kr *Keyring) Seal(b Binding, resp *idemstore.Response) (*idemstore.Response, error) {
	if resp == nil {
		return nil, nil
	}
	h, err := headerjson.Encode(resp.Header)
	if err != nil {
		return nil, fmt.Errorf("idemcrypt: encoding the header: %w", err)
	}
	aead := kr.aeads[kr.primary]
	ns := aead.NonceSize()
	// nonce | uvarint(len(h)) | h | body, sealed in place after the nonce.
	plainLen := binary.MaxVarintLen64 + len(h) + len(resp.Body)
	out := make([]byte, ns, ns+plainLen+aead.Overhead())
	if _, err := rand.Read(out); err != nil {
		return nil, fmt.Errorf("idemcrypt: reading a nonce: %w", err)
	}
	plain := binary.AppendUvarint(out[ns:], uint64(len(h)))
	plain = append(plain, h...)
	plain = append(plain, resp.Body...)
	var adBuf [384]byte
	ad := additionalData(adBuf[:0], formatV2, b, resp.Status, kr.primary)
	// In place: the ciphertext overwrites the plaintext after the nonce.
	body := aead.Seal(out[:ns], out[:ns], plain, ad)
	return &idemstore.Response{
		Status: resp.Status,
		Sealed: formatV2 + " " + kr.primary,
		Body:   body,
	}, nil
}

// Open returns the response that resp seals for the record b. A response
// that is not sealed (stored before encryption was turned on) is returned
// as it is. A response sealed in format v1 (before version 2 bound the
// fingerprint and the creation time) opens with the identity alone. A
// sealed response under a key the keyring does not hold, or a nil keyring,
// gives a *KeyError wrapping ErrUnknownKey; one that does not authenticate,
// a *KeyError wrapping ErrOpen. The result shares nothing with resp.
func (kr *Keyring) Open(b Binding, resp *idemstore.Response) (*idemstore.Response, error) {
	format, name, sealed := sealedFormat(resp)
	if !sealed {
		return resp, nil
	}
	var aead interface {
		NonceSize() int
		Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error)
	}
	if kr != nil {
		if a, ok := kr.aeads[name]; ok {
			aead = a
		}
	}
	if aead == nil {
		return nil, &KeyError{Name: name, Err: ErrUnknownKey}
	}
	ns := aead.NonceSize()
	if len(resp.Body) < ns {
		return nil, &KeyError{Name: name, Err: ErrOpen}
	}
	var adBuf [384]byte
	ad := additionalData(adBuf[:0], format, b, resp.Status, name)
	plain, err := aead.Open(nil, resp.Body[:ns], resp.Body[ns:], ad)
	if err != nil {
		return nil, &KeyError{Name: name, Err: ErrOpen}
	}
	n, w := binary.Uvarint(plain)
	if w <= 0 || n > uint64(len(plain)-w) {
		return nil, &KeyError{Name: name, Err: ErrOpen}
	}
	h, err := headerjson.Decode(string(plain[w : w+int(n)]))
	if err != nil {
		return nil, fmt.Errorf("idemcrypt: decoding the sealed header (key %q): %w", name, err)
	}
	return &idemstore.Response{Status: resp.Status, Header: h, Body: plain[w+int(n):]}, nil
}

// additionalData appends the authenticated data of a sealed response of
// format: a version tag, the record's identity, the status and the key
// name, and in v2 the fingerprint and the creation time (in microseconds,
// the precision every store keeps), each variable part prefixed with its
// length (no delimiter injection). v1 is kept byte for byte, so that
// responses sealed before v2 still open.
func additionalData(dst []byte, format string, b Binding, status int, keyName string) []byte {
	if format == formatV1 {
		dst = append(dst, "idem-sealed-v1"...)
		for _, s := range [...]string{b.Scope, b.Endpoint, b.Key, keyName} {
			dst = binary.AppendUvarint(dst, uint64(len(s)))
			dst = append(dst, s...)
		}
		return binary.AppendVarint(dst, int64(status))
	}
	dst = append(dst, "idem-sealed-v2"...)
	for _, s := range [...]string{b.Scope, b.Endpoint, b.Key, keyName, b.Fingerprint} {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	dst = binary.AppendVarint(dst, int64(status))
	return binary.AppendVarint(dst, b.CreatedAt.UnixMicro())
}
