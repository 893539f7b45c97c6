-- Reconciliation from the provider's side: the ledger is read page by page
-- from a watermark, and charges that match no succeeded payment are kept.
-- Two tables, each made only when missing, so that the migration can be
-- applied again after a failure between them (MySQL commits DDL at once).

-- The one row of the watermark: every charge up to seq was checked.
CREATE TABLE IF NOT EXISTS payments_ledger_watermark (
    id         INT         NOT NULL,
    seq        BIGINT      NOT NULL,
    updated_at DATETIME(6) NOT NULL,

    CONSTRAINT payments_ledger_watermark_pkey PRIMARY KEY (id),
    CONSTRAINT payments_ledger_watermark_id_check CHECK (id = 1),
    CONSTRAINT payments_ledger_watermark_seq_check CHECK (seq >= 0)
) ENGINE = InnoDB;

-- Charges with no payment (no_payment) or whose payment failed
-- (payment_failed): money taken, customer told no. One row per charge.
CREATE TABLE IF NOT EXISTS payments_ledger_discrepancies (
    charge_id    VARBINARY(255) NOT NULL,
    charge_seq   BIGINT         NOT NULL,
    kind         VARCHAR(32) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    -- The charge's reference: the payment's id when the service made it.
    reference    VARBINARY(255) NOT NULL,
    payment_id   VARBINARY(255) NULL,
    tenant       VARBINARY(255) NULL,
    amount_cents BIGINT         NOT NULL,
    currency     VARCHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    charged_at   DATETIME(6)    NOT NULL,
    found_at     DATETIME(6)    NOT NULL,
    -- Set when an operator marks the discrepancy handled (the console).
    resolved_at  DATETIME(6)    NULL,
    resolved_by  TEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NULL,

    CONSTRAINT payments_ledger_discrepancies_pkey PRIMARY KEY (charge_id),
    CONSTRAINT payments_ledger_discrepancies_kind_check CHECK (kind IN ('no_payment', 'payment_failed')),
    INDEX payments_ledger_discrepancies_found_idx (found_at)
) ENGINE = InnoDB;
