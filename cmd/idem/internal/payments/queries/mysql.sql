-- Statements of the payments service on MySQL 8 or MariaDB 10.6+. Each
-- starts with a "-- name: NAME" line; arguments are positional (?), in the
-- order each statement's comment gives when it is not the order of the
-- columns. Times are UTC DATETIME(6).

-- name: insert
-- The seq is the insert's LAST_INSERT_ID. id, tenant, idempotency_key,
-- customer_id, amount_cents, currency, provider_key, outbox_id, created_at,
-- updated_at.
INSERT INTO payments (id, tenant, idempotency_key, customer_id, amount_cents, currency,
                      status, provider_key, outbox_id, created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?)

-- name: get_by_key
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM payments WHERE tenant = ? AND idempotency_key = ?

-- name: get
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM payments WHERE tenant = ? AND id = ?

-- name: get_by_id
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM payments WHERE id = ?

-- name: list
-- tenant, before, limit.
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM payments WHERE tenant = ? AND seq < ?
ORDER BY seq DESC LIMIT ?

-- name: mark_succeeded
-- charge_id, now, id.
UPDATE payments
SET status = 'succeeded', charge_id = ?, failure_reason = NULL, next_reconcile_at = NULL, updated_at = ?
WHERE id = ? AND status <> 'succeeded'

-- name: mark_failed
-- reason, now, id.
UPDATE payments
SET status = 'failed', failure_reason = ?, next_reconcile_at = NULL, updated_at = ?
WHERE id = ? AND status IN ('pending', 'requires_reconciliation')

-- name: mark_unknown
-- now, id.
UPDATE payments
SET status = 'requires_reconciliation', updated_at = ?
WHERE id = ? AND status IN ('pending', 'requires_reconciliation')

-- name: defer_reconcile
-- next, id.
UPDATE payments
SET reconcile_attempts = reconcile_attempts + 1, next_reconcile_at = ?
WHERE id = ? AND status IN ('pending', 'requires_reconciliation')

-- name: unsettled
-- Payments the reconciler must look at: those whose outcome is unknown, and
-- pending ones whose outbox row is no longer pending (dead-lettered, or done
-- without the payment being settled). now, limit.
SELECT p.seq, p.id, p.tenant, p.customer_id, p.amount_cents, p.currency, p.status, p.provider_key,
       p.outbox_id, p.charge_id, p.failure_reason, p.reconcile_attempts, p.created_at, p.updated_at,
       COALESCE(o.state, 'missing'), COALESCE(o.updated_at, p.updated_at)
FROM payments p LEFT JOIN idem_outbox o ON o.id = p.outbox_id
WHERE p.status IN ('pending', 'requires_reconciliation')
  AND (p.status = 'requires_reconciliation' OR o.state IS NULL OR o.state <> 'pending')
  AND (p.next_reconcile_at IS NULL OR p.next_reconcile_at <= ?)
ORDER BY p.seq LIMIT ?

-- name: setting_get
SELECT value FROM payments_settings WHERE name = ?

-- name: setting_add
-- Keeps the first value: a second is a no-op (not INSERT IGNORE, which would
-- hide other errors too).
INSERT INTO payments_settings (name, value) VALUES (?, ?)
ON DUPLICATE KEY UPDATE name = name

-- name: any_payment
SELECT EXISTS (SELECT 1 FROM payments)

-- name: ledger_watermark
-- The seq up to which the provider's ledger was checked; no row means 0.
SELECT seq FROM payments_ledger_watermark WHERE id = 1

-- name: ledger_advance
-- Moves the watermark to seq, never back (several processes may run
-- passes). seq, now. The assignments run left to right: updated_at reads
-- the old seq.
INSERT INTO payments_ledger_watermark (id, seq, updated_at) VALUES (1, ?, ?)
ON DUPLICATE KEY UPDATE
    updated_at = IF(seq < VALUES(seq), VALUES(updated_at), updated_at),
    seq = GREATEST(seq, VALUES(seq))

-- name: ledger_report
-- Keeps a discrepancy once per charge: a known one is a duplicate key
-- (error 1062), which the caller reads as "already known".
INSERT INTO payments_ledger_discrepancies (charge_id, charge_seq, kind, reference, payment_id,
    tenant, amount_cents, currency, charged_at, found_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)

-- name: ledger_list
-- At most limit discrepancies with a charge seq below before, newest charge
-- first. before, limit.
SELECT d.charge_id, d.charge_seq, d.kind, d.reference, d.payment_id, d.tenant, d.amount_cents,
       d.currency, d.charged_at, d.found_at, d.resolved_at, d.resolved_by, p.status
FROM payments_ledger_discrepancies d LEFT JOIN payments p ON p.id = d.payment_id
WHERE d.charge_seq < ?
ORDER BY d.charge_seq DESC LIMIT ?

-- name: ledger_counts
-- The open (not resolved) discrepancies of each kind.
SELECT kind, COUNT(*) FROM payments_ledger_discrepancies WHERE resolved_at IS NULL GROUP BY kind

-- name: ledger_resolve
-- Marks an open discrepancy handled; no row changes when none is open.
-- now, by, charge_id.
UPDATE payments_ledger_discrepancies SET resolved_at = ?, resolved_by = ?
WHERE charge_id = ? AND resolved_at IS NULL

-- name: ledger_payments
-- The payments whose id is in the list {{ids}} (the references of a page
-- of the provider's ledger), in one statement.
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM payments WHERE id IN ({{ids}})
