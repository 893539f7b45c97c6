package idem

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
)

// Problem codes: the short names carried in the "code" member of every
// problem+json answer and appended to Config.ProblemBaseURI to form "type".
const (
	CodeKeyMissing       = "key-missing"
	CodeKeyInvalid       = "key-invalid"
	CodeKeyReused        = "key-reused"
	CodeKeyInUse         = "key-in-use"
	CodeOutcomeUnknown   = "outcome-unknown"
	CodeNotReplayable    = "not-replayable"
	CodeBodyTooLarge     = "body-too-large"
	CodeStoreUnavailable = "store-unavailable"
	CodeTooManyKeys      = "too-many-keys"
	// CodeBodyUnreadable answers a request whose body could not be read
	// (the client went away or sent a broken body); nothing is stored.
	CodeBodyUnreadable = "body-unreadable"
	// CodeBodyTimeout answers 408 a request whose body did not arrive
	// within Config.BodyTimeout; nothing is stored.
	CodeBodyTimeout = "body-timeout"
	// CodeConflict is the Appstrate profile's code for a reused key.
	CodeConflict = "conflict"
	// CodeUnauthorized answers a request whose scope could not be determined.
	CodeUnauthorized = "unauthorized"
)

// ErrKeyInvalid is wrapped by every error ParseKey returns. The wrapping
// error's text says why the key was refused and never contains the key, so it
// may be shown to clients.
var ErrKeyInvalid = errors.New("invalid Idempotency-Key")

// ErrNotTransactional is returned by RunPhases outside a request protected
// by a middleware in transactional mode.
var ErrNotTransactional = errors.New("idem: phases need a request in transactional mode")

// Problem is an RFC 9457 problem details object as the middleware writes it.
// Detail is client-facing text: it never contains keys, tokens or bodies.
type Problem struct {
	Type   string `json:"type"`
	Title  string `json:"title"`
	Status int    `json:"status"`
	Detail string `json:"detail,omitempty"`
	Code   string `json:"code"`
}

var problemTitles = map[string]string{
	CodeKeyMissing:       "Idempotency-Key header missing",
	CodeKeyInvalid:       "Idempotency-Key header invalid",
	CodeKeyReused:        "Idempotency-Key reused with another request",
	CodeKeyInUse:         "Request with this Idempotency-Key in progress",
	CodeOutcomeUnknown:   "Outcome of the earlier request unknown",
	CodeNotReplayable:    "Response cannot be replayed",
	CodeBodyTooLarge:     "Request body too large",
	CodeStoreUnavailable: "Idempotency store unavailable",
	CodeTooManyKeys:      "Too many idempotency keys",
	CodeBodyUnreadable:   "Request body unreadable",
	CodeBodyTimeout:      "Request body too slow",
	CodeConflict:         "Idempotency-Key conflict",
	CodeUnauthorized:     "Unauthorized",
}

// writeProblem answers with an application/problem+json body. retryAfter,
// when positive, is sent as Retry-After in seconds.
func (m *middleware) writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter int) {
	p := Problem{
		Type:   m.cfg.ProblemBaseURI + code,
		Title:  problemTitles[code],
		Status: status,
		Detail: detail,
		Code:   code,
	}
	body, err := json.Marshal(p)
	if err != nil { // cannot happen with these field types
		body = []byte(`{"status":500}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/problem+json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(status)
	w.Write(body)
}
