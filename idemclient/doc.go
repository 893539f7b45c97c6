// Package idemclient is a retrying HTTP client that makes state-changing calls
// safe to retry by sending an Idempotency-Key.
//
// It follows the shape of hashicorp/go-retryablehttp: a Client with exported
// fields, pluggable retry policies (CheckRetry) and backoffs (Backoff) with
// exported defaults, and an adapter to *http.Client (StandardClient) or
// http.RoundTripper (RoundTripper).
//
// For POST and PATCH (KeyMethods), Do generates one key per logical call
// before the first send and reuses it on every attempt, so a server running
// the idem middleware executes the call at most once however often the
// client retries. An application that persists its intent can persist the key
// with it and pass it back with WithKey after its own restart; a request that
// already carries an Idempotency-Key header keeps it.
//
// Keyed requests are retried on connection errors and timeouts, on 409 with
// problem code key-in-use, 429, 408, 425 and 5xx other than 501 and 505,
// honouring Retry-After. A 409 outcome-unknown is retried with a longer
// backoff (UnknownOutcomeBackoff), since it resolves only when the server
// reconciles the call; 400, 422 key-reused, other 4xx and 500
// response-untrusted are final. Requests without a
// key are retried only when their method is idempotent (RFC 9110), and then
// only on connection errors and 503.
//
// The returned Response tells whether the answer was a replay of an earlier
// execution (Idempotent-Replayed: true), how many attempts it took and which
// key was sent. Keys are logged only as a short hash (idempotency_key_hash).
package idemclient
