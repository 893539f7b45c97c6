-- Payments of the reference payments service. Times are integer unix
-- microseconds, as in the idem and outbox tables next to it.
CREATE TABLE payments (
    -- seq orders a tenant's payments for cursor pagination.
    seq                INTEGER NOT NULL CONSTRAINT payments_pkey PRIMARY KEY AUTOINCREMENT,
    id                 TEXT    NOT NULL,
    tenant             TEXT    NOT NULL,
    -- The client's Idempotency-Key. Unique per tenant for as long as the
    -- payment exists, beyond the idempotency record's retention.
    idempotency_key    TEXT    NOT NULL,
    customer_id        TEXT    NOT NULL,
    amount_cents       INTEGER NOT NULL,
    currency           TEXT    NOT NULL,
    status             TEXT    NOT NULL DEFAULT 'pending',
    -- The key sent to the provider (idem.DeriveKey of the request), and the
    -- outbox row that delivers the charge.
    provider_key       TEXT    NOT NULL,
    outbox_id          INTEGER NOT NULL,
    charge_id          TEXT,
    failure_reason     TEXT,
    reconcile_attempts INTEGER NOT NULL DEFAULT 0,
    next_reconcile_at  INTEGER,
    created_at         INTEGER NOT NULL,
    updated_at         INTEGER NOT NULL,

    CONSTRAINT payments_id_key UNIQUE (id),
    CONSTRAINT payments_tenant_idempotency_key_key UNIQUE (tenant, idempotency_key),
    CONSTRAINT payments_provider_key_key UNIQUE (provider_key),
    CONSTRAINT payments_amount_cents_check CHECK (amount_cents > 0 AND amount_cents <= 100000000),
    CONSTRAINT payments_currency_check CHECK (length(currency) = 3 AND currency = upper(currency)),
    CONSTRAINT payments_customer_id_check CHECK (customer_id <> '' AND length(customer_id) <= 255),
    CONSTRAINT payments_status_check
        CHECK (status IN ('pending', 'succeeded', 'failed', 'requires_reconciliation')),
    CONSTRAINT payments_charge_check CHECK (status <> 'succeeded' OR charge_id IS NOT NULL)
) STRICT;

-- A tenant's payments, newest first.
CREATE INDEX payments_tenant_seq_idx ON payments (tenant, seq);

-- The reconciler's work: payments not settled yet.
CREATE INDEX payments_unsettled_idx ON payments (seq)
    WHERE status IN ('pending', 'requires_reconciliation');
