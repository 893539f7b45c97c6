package idemcrypt

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
	"github.com/idem-dev/idem/internal/neverstored"
)

// HeaderSealed is the one header of a sealed response as stored: its value
// is "v1 NAME", the format and the name of the key that sealed it. The
// middleware and the reconciler by URL never store a response header of
// this name (internal/neverstored).
const HeaderSealed = neverstored.Sealed

const formatV1 = "v1"

var (
	// ErrUnknownKey is returned when a record is sealed under a key the
	// keyring does not hold (or there is no keyring). The error is a
	// *KeyError naming the key.
	ErrUnknownKey = errors.New("idemcrypt: the response is sealed under a key the keyring does not hold")
	// ErrOpen is returned when a sealed response does not open under its
	// key: it was sealed for another record (moved ciphertext), altered, or
	// the key of that name holds other material. The error is a *KeyError.
	ErrOpen = errors.New("idemcrypt: the sealed response does not open (altered, moved from another record, or another key of the same name)")
)

// KeyError is an error opening a sealed response: Err (ErrUnknownKey or
// ErrOpen) with the name of the key the record names. It never holds key
// material or any of the response.
type KeyError struct {
	Name string
	Err  error
}

func (e *KeyError) Error() string { return fmt.Sprintf("%v (key %q)", e.Err, e.Name) }

// Unwrap returns Err.
func (e *KeyError) Unwrap() error { return e.Err }

// SealedBy returns the name of the key that sealed resp, and whether resp is
// sealed at all. A nil response is not sealed.
func SealedBy(resp *idemstore.Response) (name string, sealed bool) {
	if resp == nil || len(resp.Header) != 1 {
		return "", false
	}
	vs := resp.Header[HeaderSealed]
	if len(vs) != 1 {
		return "", false
	}
	name, ok := strings.CutPrefix(vs[0], formatV1+" ")
	if !ok || validName(name) != nil {
		return "", false
	}
	return name, true
}

// Seal returns resp sealed for the record id under the keyring's first key:
// the same Status (stored in the clear), a header of HeaderSealed only, and
// a body of a random 12-byte nonce followed by the AES-256-GCM encryption
// of the headers and the body. The additional authenticated data is the
// record's identity, the status and the key name, so a sealed response
// opens for its own record only. A nil resp is returned as nil. resp is not
// modified.
func (kr *Keyring) Seal(id idemstore.Identity, resp *idemstore.Response) (*idemstore.Response, error) {
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
	var adBuf [256]byte
	ad := additionalData(adBuf[:0], id, resp.Status, kr.primary)
	// In place: the ciphertext overwrites the plaintext after the nonce.
	body := aead.Seal(out[:ns], out[:ns], plain, ad)
	return &idemstore.Response{
		Status: resp.Status,
		Header: http.Header{HeaderSealed: {formatV1 + " " + kr.primary}},
		Body:   body,
	}, nil
}

// Open returns the response that resp seals for the record id. A response
// that is not sealed (stored before encryption was turned on) is returned
// as it is. A sealed response under a key the keyring does not hold, or a
// nil keyring, gives a *KeyError wrapping ErrUnknownKey; one that does not
// authenticate, a *KeyError wrapping ErrOpen. The result shares nothing
// with resp.
func (kr *Keyring) Open(id idemstore.Identity, resp *idemstore.Response) (*idemstore.Response, error) {
	name, sealed := SealedBy(resp)
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
	var adBuf [256]byte
	ad := additionalData(adBuf[:0], id, resp.Status, name)
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

// additionalData appends the authenticated data of a sealed response: a
// version tag, the record's identity, the status and the key name, each
// variable part prefixed with its length (no delimiter injection).
func additionalData(b []byte, id idemstore.Identity, status int, keyName string) []byte {
	b = append(b, "idem-sealed-v1"...)
	for _, s := range [...]string{id.Scope, id.Endpoint, id.Key, keyName} {
		b = binary.AppendUvarint(b, uint64(len(s)))
		b = append(b, s...)
	}
	return binary.AppendVarint(b, int64(status))
}
