// Package idem makes retried HTTP writes safe.
//
// A client sends an Idempotency-Key header with a state-changing request. The
// middleware returned by New reserves the key in a durable store before the
// handler runs, runs the handler at most once, stores its response, and
// answers every retry of the same request with the stored response and
// Idempotent-Replayed: true.
//
// The behaviour follows draft-ietf-httpapi-idempotency-key-header, Stripe's
// idempotent requests and Brandur Leach's atomic phases. Stores live in
// sibling packages (idemsqlite, idempgx, idemredis, idemmem) and implement
// idemstore.Store.
package idem
