// Package payments is idem's reference payments service, the system the
// idempotency-key pattern was written for (`idem payments`, SPEC section 8).
//
// # API
//
//	POST /v1/payments        {"customer_id", "amount_cents", "currency"}
//	GET  /v1/payments/{id}   the payment, with its current status
//	GET  /v1/payments        the tenant's payments, newest first (?limit=, ?cursor=)
//
// Every /v1 request carries Authorization: Bearer TOKEN; the token names
// the tenant (Config.Tokens), which scopes the idempotency keys and the
// payments: another tenant's payment is 404. POST requires an
// Idempotency-Key and answers 201 with Location: /v1/payments/{id} and the
// payment, status "pending"; a retry gets the stored answer with
// Idempotent-Replayed: true, the key reused with another body 422
// key-reused.
//
// Validation: customer_id is 1 to 255 visible ASCII characters; amount_cents
// an integer literal from 1 to MaxAmountCents (100,000,000 cents, a million
// in the major unit); currency one of Currencies (codes with two minor
// units); no other member. Unparsable JSON is 400 malformed-json, a
// non-JSON Content-Type 415, an invalid payment 422 validation-failed with
// RFC 9457 "invalid-params", a body over 1 MiB 413 body-too-large, a
// missing or unknown token 401. None of them writes anything: the key is
// dropped (idem.Reject), so the corrected request may use it.
//
// # Write first, charge later
//
// POST runs under the idem middleware in transactional mode on one
// database: the payment row, an outbox row and the key's completion commit
// in one transaction, and the request never calls the provider. The
// payments table keeps (tenant, idempotency key) unique beyond the key's
// retention, so a retry that arrives after the key's record expired finds
// the existing payment (200) instead of creating a second one.
//
// Outbox relays (outbox.Relay; FOR UPDATE SKIP LOCKED on PostgreSQL) claim
// due rows and charge the provider with an Idempotency-Key derived from the
// request (idem.DerivedKeyFromContext), recording the outcome on the payment:
// pending → succeeded | failed | requires_reconciliation. A refusal is
// retried with exponential backoff and full jitter and dead-lettered after
// Config.MaxAttempts attempts, when the payment fails. A timeout or a
// dropped connection is an unknown outcome: the payment requires
// reconciliation, and is never blindly charged again — every later attempt
// first asks the provider by the derived key. Delivered (done) outbox rows
// are deleted KeyTTL after delivery, in batches, after each reconciliation
// pass (PruneOnce); pending rows and dead letters are kept.
//
// The reconciler (ReconcileOnce, every Config.ReconcileInterval) settles
// open payments by asking GET /charges?idempotency_key=KEY: found →
// succeeded; not found once the outbox row is dead-lettered and
// Config.SettleAfter has passed → failed. So at most one charge per payment
// reaches the provider's ledger (the provider also deduplicates on the key)
// and every payment ends succeeded or failed.
//
// ReconcileLedgerOnce reconciles the other way, after each pass: it pages
// through the provider's ledger (GET /charges?after=SEQ&limit=N) from a
// watermark kept in the database and reports every charge with no payment
// or whose payment failed (see ledger.go).
//
// # Storage
//
// One database holds the idem keys, the outbox and the payments; the
// migrations are embedded and applied by New. SQLite is the default, at
// ./idem.db (storeurl.Default, the file the other idem commands use by
// default, so `idem keys` and `idem maintain` see the service's keys with
// no flags); postgres://…?schema=NAME puts all the tables in that schema.
//
// # Testing hook
//
// Config.Crash is called at each CrashPoint (after_reserve, after_commit,
// after_charge, mid_reconcile). The idem command sets it from the
// environment variable IDEM_PAYMENTS_CRASH_AT to kill its own process with
// SIGKILL at that point; it exists for the crash tests and nothing else.
package payments
