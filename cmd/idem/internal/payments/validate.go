package payments

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/go-json-experiment/json/jsontext"
)

// createRequest is the body of POST /v1/payments.
type createRequest struct {
	CustomerID  string
	AmountCents int64
	Currency    string
}

// maxCustomerID bounds customer_id, in bytes.
const maxCustomerID = 255

// Problem codes of the payments API, next to the middleware's.
const (
	codeMalformedJSON    = "malformed-json"
	codeValidationFailed = "validation-failed"
	codeUnsupportedMedia = "unsupported-media-type"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not-found"
	codeInvalidQuery     = "invalid-query"
	codeInternal         = "internal"
)

// invalidParam is one member of a problem's "invalid-params" (RFC 9457).
type invalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// problem is an RFC 9457 problem the API answers.
type problem struct {
	Status        int
	Code          string
	Title         string
	Detail        string
	InvalidParams []invalidParam
}

// decodeCreate reads and validates the body of POST /v1/payments. It never
// puts the body's content in the problem: the names of unknown members only
// when they are short identifiers.
func decodeCreate(r *http.Request) (*createRequest, *problem) {
	if ct := r.Header.Get("Content-Type"); ct != "" {
		mt, _, err := mime.ParseMediaType(ct)
		if err != nil || (mt != "application/json" && !strings.HasSuffix(mt, "+json")) {
			return nil, &problem{Status: http.StatusUnsupportedMediaType, Code: codeUnsupportedMedia,
				Title: "Unsupported media type", Detail: "Send the payment as application/json."}
		}
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return nil, malformed("The request body could not be read.")
	}
	dec := jsontext.NewDecoder(bytes.NewReader(body))
	syntax := func(err error) *problem {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return malformed("The request body is empty or ends early: send a JSON object.")
		}
		return malformed(fmt.Sprintf("The request body is not valid JSON (near byte %d).", dec.InputOffset()))
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, syntax(err)
	}
	if tok.Kind() != '{' {
		// Read the rest, so that broken JSON is reported as such.
		if tok.Kind() == '[' {
			if _, err := dec.ReadValue(); err != nil {
				return nil, syntax(err)
			}
		}
		return nil, invalid(invalidParam{"", "the body must be a JSON object"})
	}
	var (
		req                   createRequest
		params                []invalidParam
		seenC, seenA, seenCur bool
	)
	for dec.PeekKind() != '}' {
		nameTok, err := dec.ReadToken()
		if err != nil {
			return nil, syntax(err)
		}
		name := nameTok.String()
		val, err := dec.ReadValue()
		if err != nil {
			return nil, syntax(err)
		}
		switch name {
		case "customer_id":
			seenC = true
			if p, ok := customerID(val, &req); !ok {
				params = append(params, p)
			}
		case "amount_cents":
			seenA = true
			if p, ok := amountCents(val, &req); !ok {
				params = append(params, p)
			}
		case "currency":
			seenCur = true
			if p, ok := currency(val, &req); !ok {
				params = append(params, p)
			}
		default:
			params = append(params, invalidParam{memberName(name), "is not a member of a payment (customer_id, amount_cents, currency)"})
		}
	}
	if _, err := dec.ReadToken(); err != nil { // '}'
		return nil, syntax(err)
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		return nil, malformed("The request body has data after the JSON object.")
	}
	for _, m := range []struct {
		seen bool
		name string
	}{{seenC, "customer_id"}, {seenA, "amount_cents"}, {seenCur, "currency"}} {
		if !m.seen {
			params = append(params, invalidParam{m.name, "is required"})
		}
	}
	if len(params) > 0 {
		return nil, invalid(params...)
	}
	return &req, nil
}

func malformed(detail string) *problem {
	return &problem{Status: http.StatusBadRequest, Code: codeMalformedJSON, Title: "Malformed JSON", Detail: detail}
}

func invalid(params ...invalidParam) *problem {
	return &problem{Status: http.StatusUnprocessableEntity, Code: codeValidationFailed,
		Title: "The payment is invalid", Detail: "See invalid-params; nothing was recorded, correct the request and send it again with the same key.",
		InvalidParams: params}
}

// memberName returns an unknown member's name fit for a problem: itself
// when it is a short identifier, and a placeholder otherwise.
func memberName(name string) string {
	if len(name) == 0 || len(name) > 64 {
		return "(unsupported member)"
	}
	for _, c := range []byte(name) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return "(unsupported member)"
		}
	}
	return name
}

func customerID(val jsontext.Value, req *createRequest) (invalidParam, bool) {
	const name = "customer_id"
	s, ok := stringValue(val)
	switch {
	case !ok:
		return invalidParam{name, "must be a string"}, false
	case s == "":
		return invalidParam{name, "must not be empty"}, false
	case len(s) > maxCustomerID:
		return invalidParam{name, fmt.Sprintf("must have at most %d characters", maxCustomerID)}, false
	}
	for _, c := range []byte(s) {
		if c <= ' ' || c >= 0x7f {
			return invalidParam{name, "must be visible ASCII characters, without spaces"}, false
		}
	}
	req.CustomerID = s
	return invalidParam{}, true
}

func amountCents(val jsontext.Value, req *createRequest) (invalidParam, bool) {
	const name = "amount_cents"
	if val.Kind() != '0' {
		return invalidParam{name, "must be an integer number of cents"}, false
	}
	text := string(val)
	if strings.ContainsAny(text, ".eE") {
		return invalidParam{name, "must be an integer number of cents, without a fraction or exponent"}, false
	}
	n, err := strconv.ParseInt(text, 10, 64)
	switch {
	case err != nil && strings.HasPrefix(text, "-"), err == nil && n <= 0:
		return invalidParam{name, "must be greater than 0"}, false
	case err != nil, n > MaxAmountCents:
		return invalidParam{name, fmt.Sprintf("must be at most %d", MaxAmountCents)}, false
	}
	req.AmountCents = n
	return invalidParam{}, true
}

func currency(val jsontext.Value, req *createRequest) (invalidParam, bool) {
	const name = "currency"
	s, ok := stringValue(val)
	if !ok {
		return invalidParam{name, "must be a string"}, false
	}
	if !slices.Contains(Currencies, s) {
		return invalidParam{name, "must be one of " + strings.Join(Currencies, ", ")}, false
	}
	req.Currency = s
	return invalidParam{}, true
}

// stringValue unquotes a JSON string value.
func stringValue(val jsontext.Value) (string, bool) {
	if val.Kind() != '"' {
		return "", false
	}
	b, err := jsontext.AppendUnquote(nil, val)
	if err != nil {
		return "", false
	}
	return string(b), true
}
