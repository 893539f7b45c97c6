package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
)

// HTTPOutcome classifies the result of sending a message over HTTP with its
// Idempotency-Key, for Deliver hooks:
//
//	return outbox.HTTPOutcome(client.Do(req))
//
// The rules lean to OutcomeUnknown whenever the downstream may have acted:
//
//   - an error before the request could be sent (the connection was refused
//     or its address not found): OutcomeRetry;
//   - any other error (a timeout, a connection closed after the request was
//     written): OutcomeUnknown;
//   - 2xx: OutcomeDelivered;
//   - 408, 425, 429 and 503, and 409 with the problem code "key-in-use" (an
//     earlier attempt still runs; a later retry gets its result): OutcomeRetry;
//   - any other 409 (e.g. "outcome-unknown") and any other 5xx: OutcomeUnknown;
//   - any other 4xx (and 1xx, 3xx): OutcomePermanent.
//
// The error describes a failure by its status and problem code, never by
// the body. HTTPOutcome drains and closes resp.Body.
func HTTPOutcome(resp *http.Response, err error) (Outcome, error) {
	if err != nil {
		if notSent(err) {
			return OutcomeRetry, err
		}
		return OutcomeUnknown, err
	}
	defer resp.Body.Close()
	code := problemCode(resp)
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return OutcomeDelivered, nil
	}
	failure := fmt.Errorf("downstream answered %s", resp.Status)
	if code != "" {
		failure = fmt.Errorf("downstream answered %s (problem %s)", resp.Status, code)
	}
	switch {
	case resp.StatusCode == http.StatusConflict && code == "key-in-use":
		return OutcomeRetry, fmt.Errorf("%w: %w", ErrInFlight, failure)
	case resp.StatusCode == http.StatusRequestTimeout, resp.StatusCode == http.StatusTooEarly,
		resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode == http.StatusServiceUnavailable:
		return OutcomeRetry, failure
	case resp.StatusCode == http.StatusConflict, resp.StatusCode >= 500:
		return OutcomeUnknown, failure
	}
	return OutcomePermanent, failure
}

// notSent reports an error raised before the request left: dialing failed.
func notSent(err error) bool {
	var opErr *net.OpError
	if errors.As(err, &opErr) && opErr.Op == "dial" {
		return true
	}
	var dnsErr *net.DNSError
	return errors.As(err, &dnsErr)
}

// problemCode returns the "code" member of an RFC 9457 problem answer.
func problemCode(resp *http.Response) string {
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if mt != "application/problem+json" {
		return ""
	}
	var p struct {
		Code string `json:"code"`
	}
	if json.NewDecoder(io.LimitReader(resp.Body, 1<<16)).Decode(&p) != nil || len(p.Code) > 64 {
		return ""
	}
	return p.Code
}
