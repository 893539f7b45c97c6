// Package idemgrpc makes retried unary gRPC calls safe: a server
// interceptor that runs each call at most once per idempotency key, on an
// idem store, and answers every retry with the stored answer, and a client
// interceptor that attaches a key and retries with it. It is an adapter on
// idem's HTTP-free core (idem.Guard): the states, leases, wait and
// transactional modes, metrics and tracing are the middleware's.
//
// # Server
//
// UnaryServerInterceptor takes the key from the "idempotency-key" metadata
// entry or, when Config.KeyField names one, from a string field of the
// request message (AIP-155's request_id). The record's identity is (scope,
// full method name, key): Config.Scope names the tenant (from the
// authenticated peer or metadata, never from the message), and the
// endpoint is the full method ("/pkg.Service/Method"), so `idem keys` and
// the console show the gRPC method.
//
// Covered methods: every unary method by default (Config.Methods or
// Config.Covered narrow it to the mutations). Covering all is the safe
// default: a method the interceptor was not told about is protected when
// its caller sends a key, where the opposite default would silently run a
// retried mutation twice. A covered read costs one store round trip and
// answers a retry with the stored answer, which is what a key asks for.
// Calls without a key pass through unless Config.RequireKey is set.
//
// Streaming calls are not protected. StreamServerInterceptor, installed
// with the same Config, refuses every covered streaming method with
// FAILED_PRECONDITION (STREAMING_UNSUPPORTED) instead of running it
// unprotected; a stream that is not covered passes through. Without it,
// gRPC runs streams past the unary interceptor whatever the Config says.
//
// The fingerprint is the request message's deterministic protobuf encoding
// (proto.MarshalOptions{Deterministic: true}, map entries sorted), hashed
// with the method name by idem.FingerprintBytes. It is taken from the
// message the server decoded, so the client's language, library and field
// order do not matter; unknown fields are kept, so two requests that differ
// only in a field this build does not know are never taken for one;
// google.protobuf.Any needs no type registry; and it costs one marshal.
// The other candidate, protojson canonicalised with RFC 8785, drops unknown
// fields, fails on an Any whose type is not linked in, and costs more
// (BenchmarkFingerprint: about 4 times on a generated message, 1.7 times
// on a dynamic one). The price of the choice: protobuf-go does not promise that
// the deterministic encoding stays byte-identical across its releases or
// across schema versions, so a retry that lands on a server built
// differently may be refused with INVALID_ARGUMENT (key reused) — a
// refusal, never a wrong replay. Config.FingerprintExclude drops top-level
// fields (a client timestamp) from the fingerprint.
//
// What is stored: the response message (its protobuf bytes, replayed as
// the same message type), or the final status (code, message and details)
// of a handler error that is kept. Which handler errors are kept and which
// release the key (a retry runs the handler again) follows the HTTP
// middleware's rule (SPEC section 3: 4xx are stored; 5xx, 408, 425 and 429
// release), through the usual HTTP mapping of gRPC codes:
//
//	code                  HTTP  outcome
//	OK                    200   stored (the response message)
//	INVALID_ARGUMENT      400   stored (the status)
//	FAILED_PRECONDITION   400   stored
//	OUT_OF_RANGE          400   stored
//	UNAUTHENTICATED       401   stored
//	PERMISSION_DENIED     403   stored
//	NOT_FOUND             404   stored
//	ALREADY_EXISTS        409   stored
//	ABORTED               409   released: gRPC's "retry the whole operation"
//	RESOURCE_EXHAUSTED    429   released
//	CANCELLED             499   released: the handler gave up
//	UNKNOWN               500   released (a plain Go error is UNKNOWN)
//	INTERNAL              500   released
//	DATA_LOSS             500   released
//	UNIMPLEMENTED         501   released
//	UNAVAILABLE           503   released
//	DEADLINE_EXCEEDED     504   released
//
// ABORTED is the one departure from the mapping: HTTP 409 is stored, but a
// gRPC handler answers ABORTED for a concurrency conflict that a retry of
// the whole operation resolves, so it releases the key. Config.Release
// replaces the rule. A handler whose effect may have happened before it
// failed calls idem.MarkUnknown(ctx) first (the record becomes unknown and
// is not run again until reconciled); idem.Reject(ctx) drops the record so
// the corrected request may reuse the key. The HTTP status in the second
// column is what the store keeps as the record's status (what `idem keys`
// shows); the exact gRPC code is kept in the record's metadata
// ("Grpc-Status").
//
// Refusals are gRPC statuses with a google.rpc.ErrorInfo (domain
// ErrorDomain, reason one of the Reason constants) and, where waiting
// helps, a google.rpc.RetryInfo:
//
//	key reused with another request   INVALID_ARGUMENT     KEY_REUSED
//	key invalid / missing (required)  INVALID_ARGUMENT     KEY_INVALID / KEY_MISSING
//	in flight                         ABORTED              KEY_IN_USE + RetryInfo
//	outcome unknown                   FAILED_PRECONDITION  OUTCOME_UNKNOWN + RetryInfo
//	stored answer not replayable      FAILED_PRECONDITION  NOT_REPLAYABLE
//	stored answer fails verification  DATA_LOSS            RESPONSE_UNTRUSTED
//	store unavailable                 UNAVAILABLE          STORE_UNAVAILABLE + RetryInfo
//	per-scope limit                   RESOURCE_EXHAUSTED   TOO_MANY_KEYS + RetryInfo
//	Config.Scope failed               UNAUTHENTICATED      (no details)
//	covered streaming method          FAILED_PRECONDITION  STREAMING_UNSUPPORTED
//
// A replay carries "idempotent-replayed: true" in its header and trailer
// metadata. Header and trailer metadata the handler set is delivered with
// the first answer only; it is not stored.
//
// # Client
//
// UnaryClientInterceptor attaches a key (a UUID) to covered calls that have
// none in their outgoing metadata, keeps it across the retries it makes,
// and retries with exponential backoff and full jitter: UNAVAILABLE and
// DEADLINE_EXCEEDED (the call may or may not have reached the server; with
// the key, a retry is safe), ABORTED and RESOURCE_EXHAUSTED after the
// RetryInfo delay, INTERNAL and UNKNOWN (the server released the key),
// and FAILED_PRECONDITION OUTCOME_UNKNOWN with a longer backoff. Attempts
// and the total time are bounded. Its field names follow package
// idemclient's where they mean the same thing.
package idemgrpc
