package idem

import (
	"encoding/json"
	"net/http"
	"strconv"
)

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
	CodeKeyMissing:        "Idempotency-Key header missing",
	CodeKeyInvalid:        "Idempotency-Key header invalid",
	CodeKeyReused:         "Idempotency-Key reused with another request",
	CodeKeyInUse:          "Request with this Idempotency-Key in progress",
	CodeOutcomeUnknown:    "Outcome of the earlier request unknown",
	CodeNotReplayable:     "Response cannot be replayed",
	CodeBodyTooLarge:      "Request body too large",
	CodeStoreUnavailable:  "Idempotency store unavailable",
	CodeTooManyKeys:       "Too many idempotency keys",
	CodeBodyUnreadable:    "Request body unreadable",
	CodeBodyTimeout:       "Request body too slow",
	CodeConflict:          "Idempotency-Key conflict",
	CodeUnauthorized:      "Unauthorized",
	CodeResponseUntrusted: "Stored response cannot be trusted",
}

// writeProblem answers with an application/problem+json body, or under
// the Stripe profile with Stripe's error object (writeStripeError).
// retryAfter, when positive, is sent as Retry-After in seconds.
func (m *middleware) writeProblem(w http.ResponseWriter, status int, code, detail string, retryAfter int) {
	if m.cfg.Profile == ProfileStripe {
		writeStripeError(w, status, code, detail, m.cfg.ProblemBaseURI+code, retryAfter)
		return
	}
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

// stripeError is the error object of Stripe's API, as the Stripe profile
// answers it: {"error":{"type":…,"code":…,"message":…,"doc_url":…}}.
type stripeError struct {
	Type    string `json:"type"`
	Code    string `json:"code,omitempty"`
	Message string `json:"message"`
	DocURL  string `json:"doc_url,omitempty"`
}

// stripeAnswer is how the Stripe profile words one problem code: the
// status Stripe uses for that kind of error (Stripe answers only 400, 401,
// 402, 403, 404, 409, 429 and 5xx), Stripe's error type, the code (Stripe's
// own where it has one for the same situation, the problem code
// otherwise), and the Stripe-Should-Retry advice ("" sends none).
type stripeAnswer struct {
	status      int
	typ, code   string
	shouldRetry string
}

// Stripe's error types.
const (
	stripeIdempotencyError    = "idempotency_error"
	stripeInvalidRequestError = "invalid_request_error"
	stripeAPIError            = "api_error"
)

// stripeAnswers maps every problem code the middleware answers to Stripe's
// wording. Stripe's SDKs read a body of this shape as a typed error and
// never retry it (stripe-go), or retry it as Stripe-Should-Retry says
// (the others).
var stripeAnswers = map[string]stripeAnswer{
	CodeKeyMissing:       {http.StatusBadRequest, stripeIdempotencyError, CodeKeyMissing, "false"},
	CodeKeyInvalid:       {http.StatusBadRequest, stripeIdempotencyError, CodeKeyInvalid, "false"},
	CodeKeyReused:        {http.StatusBadRequest, stripeIdempotencyError, CodeKeyReused, "false"},
	CodeKeyInUse:         {http.StatusConflict, stripeIdempotencyError, "idempotency_key_in_use", "true"},
	CodeOutcomeUnknown:   {http.StatusConflict, stripeIdempotencyError, CodeOutcomeUnknown, "false"},
	CodeNotReplayable:    {http.StatusConflict, stripeIdempotencyError, CodeNotReplayable, "false"},
	CodeBodyTooLarge:     {http.StatusBadRequest, stripeInvalidRequestError, CodeBodyTooLarge, "false"},
	CodeBodyUnreadable:   {http.StatusBadRequest, stripeInvalidRequestError, CodeBodyUnreadable, ""},
	CodeBodyTimeout:      {http.StatusBadRequest, stripeInvalidRequestError, CodeBodyTimeout, ""},
	CodeUnauthorized:     {http.StatusUnauthorized, stripeInvalidRequestError, CodeUnauthorized, "false"},
	CodeTooManyKeys:      {http.StatusTooManyRequests, stripeInvalidRequestError, "rate_limit", ""},
	CodeStoreUnavailable: {http.StatusServiceUnavailable, stripeAPIError, CodeStoreUnavailable, "true"},
	// The request completed and is never run again: a retry gets the same.
	CodeResponseUntrusted: {http.StatusInternalServerError, stripeAPIError, CodeResponseUntrusted, "false"},
}

// writeStripeError answers as Stripe's API does: its status, an
// application/json body {"error":{...}}, Stripe-Should-Retry. status is
// used only for a code stripeAnswers does not know; docURL is the problem
// type URI, where the code is documented.
func writeStripeError(w http.ResponseWriter, status int, code, message, docURL string, retryAfter int) {
	a, ok := stripeAnswers[code]
	if !ok {
		a = stripeAnswer{status: status, typ: stripeAPIError, code: code}
		if status < 500 {
			a.typ = stripeInvalidRequestError
		}
	}
	body, err := json.Marshal(struct {
		Error stripeError `json:"error"`
	}{stripeError{Type: a.typ, Code: a.code, Message: message, DocURL: docURL}})
	if err != nil { // cannot happen with these field types
		body = []byte(`{"error":{"type":"api_error"}}`)
	}
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(body)))
	h.Set("Cache-Control", "no-store")
	if a.shouldRetry != "" {
		h.Set("Stripe-Should-Retry", a.shouldRetry)
	}
	if retryAfter > 0 {
		h.Set("Retry-After", strconv.Itoa(retryAfter))
	}
	w.WriteHeader(a.status)
	w.Write(body)
}
