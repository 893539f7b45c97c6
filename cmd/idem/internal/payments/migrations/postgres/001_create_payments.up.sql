-- Payments of the reference payments service. {{schema}} is the quoted
-- schema name and a dot.
CREATE TABLE {{schema}}payments (
    -- seq orders a tenant's payments for cursor pagination.
    seq                bigint      GENERATED ALWAYS AS IDENTITY,
    id                 text        NOT NULL,
    tenant             text        NOT NULL,
    -- The client's Idempotency-Key. Unique per tenant for as long as the
    -- payment exists, beyond the idempotency record's retention.
    idempotency_key    text        NOT NULL,
    customer_id        text        NOT NULL,
    amount_cents       bigint      NOT NULL,
    currency           text        NOT NULL,
    status             text        NOT NULL DEFAULT 'pending',
    -- The key sent to the provider (idem.DeriveKey of the request), and the
    -- outbox row that delivers the charge.
    provider_key       text        NOT NULL,
    outbox_id          bigint      NOT NULL,
    charge_id          text,
    failure_reason     text,
    reconcile_attempts integer     NOT NULL DEFAULT 0,
    next_reconcile_at  timestamptz,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,

    CONSTRAINT payments_pkey PRIMARY KEY (seq),
    CONSTRAINT payments_id_key UNIQUE (id),
    CONSTRAINT payments_tenant_idempotency_key_key UNIQUE (tenant, idempotency_key),
    CONSTRAINT payments_provider_key_key UNIQUE (provider_key),
    CONSTRAINT payments_amount_cents_check CHECK (amount_cents > 0 AND amount_cents <= 100000000),
    CONSTRAINT payments_currency_check CHECK (length(currency) = 3 AND currency = upper(currency)),
    CONSTRAINT payments_customer_id_check CHECK (customer_id <> '' AND length(customer_id) <= 255),
    CONSTRAINT payments_status_check
        CHECK (status IN ('pending', 'succeeded', 'failed', 'requires_reconciliation')),
    CONSTRAINT payments_charge_check CHECK (status <> 'succeeded' OR charge_id IS NOT NULL)
);

-- A tenant's payments, newest first.
CREATE INDEX payments_tenant_seq_idx ON {{schema}}payments (tenant, seq);

-- The reconciler's work: payments not settled yet.
CREATE INDEX payments_unsettled_idx ON {{schema}}payments (seq)
    WHERE status IN ('pending', 'requires_reconciliation');
