// Package provider is the simulated payment provider of idem's reference
// payments service: a real HTTP server with a durable ledger that honours
// its own Idempotency-Key and can inject faults, so the service's outbox,
// retries and reconciliation can be exercised against a downstream that
// behaves like a bank (SPEC section 8).
//
// POST /charges requires an Idempotency-Key and is protected by idem's own
// middleware in transactional mode on the provider's store (SQLite or
// PostgreSQL): the charge and the key's completion commit together, a retry
// with the same key is answered with the stored 201 (Idempotent-Replayed:
// true) and charges nothing. The ledger table, provider_charges, also holds
// the key UNIQUE, a second line of defence that outlives the key's
// retention. GET /charges?idempotency_key=KEY answers the charge or 404 for
// reconciliation; GET /charges lists the ledger, and GET
// /charges?after=SEQ&limit=N pages through it in ledger order (each charge
// carries its seq; limit 1 to 1000, default 100), so a client can resume
// from a watermark.
//
// Faults, drawn per POST: a fail rate (503 before anything is charged), a
// timeout rate (the charge commits, then the answer is withheld until the
// client gives up — the unknown outcome a payments service must reconcile),
// and a latency before processing.
package provider
