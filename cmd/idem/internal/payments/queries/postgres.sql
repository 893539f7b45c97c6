-- Statements of the payments service on PostgreSQL. Each starts with a
-- "-- name: NAME" line; arguments are numbered. {{schema}} is the quoted schema and a dot.

-- name: insert
INSERT INTO {{schema}}payments (id, tenant, idempotency_key, customer_id, amount_cents, currency,
                      status, provider_key, outbox_id, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, 'pending', $7, $8, $9, $9)
RETURNING seq

-- name: get_by_key
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM {{schema}}payments WHERE tenant = $1 AND idempotency_key = $2

-- name: get
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM {{schema}}payments WHERE tenant = $1 AND id = $2

-- name: get_by_id
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM {{schema}}payments WHERE id = $1

-- name: list
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM {{schema}}payments WHERE tenant = $1 AND seq < $2
ORDER BY seq DESC LIMIT $3

-- name: mark_succeeded
UPDATE {{schema}}payments
SET status = 'succeeded', charge_id = $2, failure_reason = NULL, next_reconcile_at = NULL, updated_at = $3
WHERE id = $1 AND status <> 'succeeded'

-- name: mark_failed
UPDATE {{schema}}payments
SET status = 'failed', failure_reason = $2, next_reconcile_at = NULL, updated_at = $3
WHERE id = $1 AND status IN ('pending', 'requires_reconciliation')

-- name: mark_unknown
UPDATE {{schema}}payments
SET status = 'requires_reconciliation', updated_at = $2
WHERE id = $1 AND status IN ('pending', 'requires_reconciliation')

-- name: defer_reconcile
UPDATE {{schema}}payments
SET reconcile_attempts = reconcile_attempts + 1, next_reconcile_at = $2
WHERE id = $1 AND status IN ('pending', 'requires_reconciliation')

-- name: unsettled
-- Payments the reconciler must look at: those whose outcome is unknown, and
-- pending ones whose outbox row is no longer pending (dead-lettered, or done
-- without the payment being settled).
SELECT p.seq, p.id, p.tenant, p.customer_id, p.amount_cents, p.currency, p.status, p.provider_key,
       p.outbox_id, p.charge_id, p.failure_reason, p.reconcile_attempts, p.created_at, p.updated_at,
       COALESCE(o.state, 'missing'), COALESCE(o.updated_at, p.updated_at)
FROM {{schema}}payments p LEFT JOIN {{schema}}idem_outbox o ON o.id = p.outbox_id
WHERE p.status IN ('pending', 'requires_reconciliation')
  AND (p.status = 'requires_reconciliation' OR o.state IS NULL OR o.state <> 'pending')
  AND (p.next_reconcile_at IS NULL OR p.next_reconcile_at <= $1)
ORDER BY p.seq LIMIT $2

-- name: setting_get
SELECT value FROM {{schema}}payments_settings WHERE name = $1

-- name: setting_add
INSERT INTO {{schema}}payments_settings (name, value) VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING

-- name: any_payment
SELECT EXISTS (SELECT 1 FROM {{schema}}payments)

-- name: ledger_watermark
-- The seq up to which the provider's ledger was checked; no row means 0.
SELECT seq FROM {{schema}}payments_ledger_watermark WHERE id = 1

-- name: ledger_advance
-- Moves the watermark to $1, never back (several processes may run passes).
INSERT INTO {{schema}}payments_ledger_watermark AS w (id, seq, updated_at) VALUES (1, $1, $2)
ON CONFLICT ON CONSTRAINT payments_ledger_watermark_pkey
DO UPDATE SET seq = excluded.seq, updated_at = excluded.updated_at
WHERE w.seq < excluded.seq

-- name: ledger_report
-- Keeps a discrepancy once per charge; no row is returned when it was known.
INSERT INTO {{schema}}payments_ledger_discrepancies (charge_id, charge_seq, kind, reference, payment_id,
    tenant, amount_cents, currency, charged_at, found_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
ON CONFLICT ON CONSTRAINT payments_ledger_discrepancies_pkey DO NOTHING
RETURNING charge_id

-- name: ledger_list
-- At most $2 discrepancies with a charge seq below $1, newest charge first.
SELECT d.charge_id, d.charge_seq, d.kind, d.reference, d.payment_id, d.tenant, d.amount_cents,
       d.currency, d.charged_at, d.found_at, d.resolved_at, d.resolved_by, p.status
FROM {{schema}}payments_ledger_discrepancies d LEFT JOIN {{schema}}payments p ON p.id = d.payment_id
WHERE d.charge_seq < $1
ORDER BY d.charge_seq DESC LIMIT $2

-- name: ledger_counts
-- The open (not resolved) discrepancies of each kind.
SELECT kind, COUNT(*) FROM {{schema}}payments_ledger_discrepancies WHERE resolved_at IS NULL GROUP BY kind

-- name: ledger_resolve
-- Marks an open discrepancy handled; no row changes when none is open.
UPDATE {{schema}}payments_ledger_discrepancies SET resolved_at = $2, resolved_by = $3
WHERE charge_id = $1 AND resolved_at IS NULL

-- name: ledger_payments
-- The payments whose id is in the array $1 (the references of a page of
-- the provider's ledger), in one statement.
SELECT seq, id, tenant, customer_id, amount_cents, currency, status, provider_key, outbox_id,
       charge_id, failure_reason, reconcile_attempts, created_at, updated_at
FROM {{schema}}payments WHERE id = ANY($1::text[])
