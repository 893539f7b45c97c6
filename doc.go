// Package idem makes retried HTTP writes safe.
//
// A client sends an Idempotency-Key header with a state-changing request. The
// middleware returned by New reserves the key in a durable store before the
// handler runs, runs the handler at most once, stores its response, and
// answers every retry of the same request with the stored response and
// Idempotent-Replayed: true.
//
// The decision logic is not tied to HTTP: a Guard (NewGuard) runs any
// function at most once per key with the same states, leases, wait and
// transactional modes, and the middleware is one adapter on it. Do runs a
// typed Go function through a Guard, its payload fingerprinted as RFC 8785
// canonical JSON and its result stored as JSON.
//
// The behaviour follows draft-ietf-httpapi-idempotency-key-header, Stripe's
// idempotent requests and Brandur Leach's atomic phases. Stores live in
// sibling packages (idemsqlite, idempgx, idemredis, idemmem) and implement
// idemstore.Store.
package idem
