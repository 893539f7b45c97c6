package idem

import (
	"context"
	"time"
)

// Decision is what the middleware (or a Guard) decided for one protected
// request or call, as reported to Metrics.
type Decision string

// The decisions reported to Metrics.
const (
	DecisionCreated         Decision = "created"          // a new key: the handler ran
	DecisionReleasedRetried Decision = "released_retried" // a released key re-claimed: the handler ran again
	DecisionReplayed        Decision = "replayed"         // answered from the stored response
	DecisionInProgress      Decision = "in_progress"      // 409 key-in-use (or 202 in async mode)
	DecisionKeyReused       Decision = "key_reused"       // the key came with another request
	DecisionUnknown         Decision = "unknown"          // 409 outcome-unknown
	DecisionNotReplayable   Decision = "not_replayable"   // 409 not-replayable
	DecisionStoreError      Decision = "store_error"      // 503 store-unavailable (or a fail-open bypass)
	DecisionInvalid         Decision = "invalid"          // 400 key-missing/key-invalid, 413 body-too-large
	DecisionTooManyKeys     Decision = "too_many_keys"    // 429 too-many-keys
	DecisionUntrusted       Decision = "untrusted"        // 500 response-untrusted: a stored response refused, not run again
)

// Metrics receives the signals of the middleware and of Guards. Implementations must be safe
// for concurrent use and fast; idemprom adapts it to Prometheus.
type Metrics interface {
	// Decision counts one request's decision on an endpoint for a scope.
	Decision(endpoint, scope string, d Decision)
	// StoreCall observes the latency of one store call: op is "reserve",
	// "complete", "release", "mark_unknown", "delete", "renew" or "commit".
	StoreCall(op string, d time.Duration, err error)
	// ResponseStored observes the size of a stored response body.
	ResponseStored(endpoint string, bytes int)
}

type nopMetrics struct{}

func (nopMetrics) Decision(string, string, Decision)      {}
func (nopMetrics) StoreCall(string, time.Duration, error) {}
func (nopMetrics) ResponseStored(string, int)             {}

// Tracer starts the spans of the middleware and of Guards: "idem.request"
// around a protected request or call, with "idem.reserve", "idem.handler" and "idem.complete" inside it.
// Attributes carry the endpoint, a key hash (never the key) and the
// decision. idemotel adapts OpenTelemetry to it.
type Tracer interface {
	Start(ctx context.Context, name string) (context.Context, Span)
}

// Span is one span started by a Tracer.
type Span interface {
	// SetAttribute records a string attribute.
	SetAttribute(key, value string)
	// End ends the span; err, when not nil, marks it failed.
	End(err error)
}
