-- Payments of the reference payments service on MySQL 8 or MariaDB 10.6+,
-- in the connection's database. Ids, tenants and keys are VARBINARY:
-- compared byte for byte, whatever the server's collations. One statement
-- (MySQL commits DDL at once), made again harmlessly after a failure.
CREATE TABLE IF NOT EXISTS payments (
    -- seq orders a tenant's payments for cursor pagination.
    seq                BIGINT         NOT NULL AUTO_INCREMENT,
    id                 VARBINARY(255) NOT NULL,
    tenant             VARBINARY(255) NOT NULL,
    -- The client's Idempotency-Key. Unique per tenant for as long as the
    -- payment exists, beyond the idempotency record's retention.
    idempotency_key    VARBINARY(255) NOT NULL,
    customer_id        VARCHAR(255) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    amount_cents       BIGINT         NOT NULL,
    currency           VARCHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    status             VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending',
    -- The key sent to the provider (idem.DeriveKey of the request), and the
    -- outbox row that delivers the charge.
    provider_key       VARBINARY(255) NOT NULL,
    outbox_id          BIGINT         NOT NULL,
    charge_id          VARBINARY(255) NULL,
    failure_reason     TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,
    reconcile_attempts INT            NOT NULL DEFAULT 0,
    next_reconcile_at  DATETIME(6)    NULL,
    created_at         DATETIME(6)    NOT NULL,
    updated_at         DATETIME(6)    NOT NULL,

    CONSTRAINT payments_pkey PRIMARY KEY (seq),
    CONSTRAINT payments_id_key UNIQUE (id),
    CONSTRAINT payments_tenant_idempotency_key_key UNIQUE (tenant, idempotency_key),
    CONSTRAINT payments_provider_key_key UNIQUE (provider_key),
    CONSTRAINT payments_amount_cents_check CHECK (amount_cents > 0 AND amount_cents <= 100000000),
    CONSTRAINT payments_currency_check CHECK (CHAR_LENGTH(currency) = 3 AND currency = UPPER(currency)),
    CONSTRAINT payments_customer_id_check CHECK (customer_id <> ''),
    CONSTRAINT payments_status_check
        CHECK (status IN ('pending', 'succeeded', 'failed', 'requires_reconciliation')),
    CONSTRAINT payments_charge_check CHECK (status <> 'succeeded' OR charge_id IS NOT NULL),

    -- A tenant's payments, newest first.
    INDEX payments_tenant_seq_idx (tenant, seq),
    -- The reconciler's work: payments not settled yet.
    INDEX payments_unsettled_idx (status, seq)
) ENGINE = InnoDB;
