// Package outbox is the transactional outbox of idem's SQL stores: external
// side effects are written as rows in the same transaction as the business
// writes and the idempotency key's completion, and a Relay delivers them
// afterwards (SPEC sections 5 and 6).
//
// A handler enqueues a Message inside its transaction (SQLiteStore.Enqueue
// and MySQLStore.Enqueue with a *sql.Tx, PgxStore.Enqueue with a pgx.Tx), so
// the message exists if and only if the transaction commits. Each message carries the idempotency
// key the downstream deduplicates on, usually derived from the client's key
// (idem.DeriveKey): every delivery attempt sends the same key, so an attempt
// whose outcome was lost (a timeout, a dropped connection) can be sent again
// without charging twice.
//
// The Relay claims due rows in bounded batches (FOR UPDATE SKIP LOCKED on
// PostgreSQL and on MySQL 8 or MariaDB 10.6+, one atomic UPDATE … RETURNING
// on SQLite), so several relays on
// one database never deliver a row concurrently; it calls the Deliver hook,
// and records the Outcome: done, retried with exponential backoff and full
// jitter, or dead-lettered after MaxAttempts. An OutcomeUnknown can be
// settled by the OnUnknown hook, which asks the downstream by the key.
//
// Delivery is at least once: a relay that crashes after the downstream
// accepted a message but before recording it re-sends it once the claim
// expires, with the same key. The downstream must deduplicate on the key.
//
// The tables are created by the embedded migrations (Migrate on any
// store), tracked in their own table idem_outbox_migrations.
package outbox
