package idem

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
)

// callFingerprintVersion starts every fingerprint of a Call payload: a
// scheme of its own, so no payload fingerprint equals a request's (or one
// of another scheme version).
const callFingerprintVersion = "idem-call-fingerprint-v1"

// FingerprintJSON returns the hex SHA-256 fingerprint of a JSON payload for
// operation: the payload is canonicalised with RFC 8785 (as Fingerprint does
// for JSON request bodies), so member order, whitespace and number spelling
// do not matter, then narrowed by fc to selected top-level members. The
// inputs are length-prefixed. Invalid JSON is an error (from Canonicalize,
// so it may quote parts of payload: do not show it to clients).
func FingerprintJSON(operation string, payload []byte, fc FingerprintConfig) (string, error) {
	f := fingerprinterPool.Get().(*fingerprinter)
	defer f.release()
	canon, err := canonicalize(f.body, payload)
	f.body = canon[:0]
	if err != nil {
		return "", err
	}
	return f.callSum(operation, bodyKindJSON, fc.filter(canon)), nil
}

// FingerprintPayload returns FingerprintJSON of payload encoded with
// encoding/json (a []byte or json.RawMessage payload is taken as JSON text
// as it is). A nil payload fingerprints as JSON null.
func FingerprintPayload(operation string, payload any, fc FingerprintConfig) (string, error) {
	var b []byte
	switch p := payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		var err error
		if b, err = json.Marshal(payload); err != nil {
			return "", fmt.Errorf("encoding the payload: %w", err)
		}
	}
	return FingerprintJSON(operation, b, fc)
}

// FingerprintBytes returns the hex SHA-256 fingerprint of an opaque payload
// for operation, hashed as given: a deterministic protobuf encoding, a
// message body that is not JSON.
func FingerprintBytes(operation string, payload []byte) string {
	f := fingerprinterPool.Get().(*fingerprinter)
	defer f.release()
	kind := bodyKindRaw
	if len(payload) == 0 {
		kind = bodyKindEmpty
	}
	return f.callSum(operation, kind, payload)
}

// callSum hashes a Call payload of the given kind.
func (f *fingerprinter) callSum(operation, kind string, payload []byte) string {
	f.h.Reset()
	head := f.head[:0]
	head = appendField(head, callFingerprintVersion)
	head = appendField(head, operation)
	head = appendField(head, kind)
	head = binary.BigEndian.AppendUint64(head, uint64(len(payload)))
	f.head = head[:0]
	f.h.Write(head)
	f.h.Write(payload)
	sum := f.h.Sum(f.sum[:0])
	hex.Encode(f.hex[:], sum)
	return string(f.hex[:])
}
