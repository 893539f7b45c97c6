-- Reconciliation from the provider's side: the ledger is read page by page
-- from a watermark, and charges that match no succeeded payment are kept.

-- The one row of the watermark: every charge up to seq was checked.
CREATE TABLE payments_ledger_watermark (
    id         INTEGER NOT NULL CONSTRAINT payments_ledger_watermark_pkey PRIMARY KEY,
    seq        INTEGER NOT NULL,
    updated_at INTEGER NOT NULL,

    CONSTRAINT payments_ledger_watermark_id_check CHECK (id = 1),
    CONSTRAINT payments_ledger_watermark_seq_check CHECK (seq >= 0)
) STRICT;

-- Charges with no payment (no_payment) or whose payment failed
-- (payment_failed): money taken, customer told no. One row per charge.
CREATE TABLE payments_ledger_discrepancies (
    charge_id    TEXT    NOT NULL CONSTRAINT payments_ledger_discrepancies_pkey PRIMARY KEY,
    charge_seq   INTEGER NOT NULL,
    kind         TEXT    NOT NULL,
    -- The charge's reference: the payment's id when the service made it.
    reference    TEXT    NOT NULL,
    payment_id   TEXT,
    tenant       TEXT,
    amount_cents INTEGER NOT NULL,
    currency     TEXT    NOT NULL,
    charged_at   INTEGER NOT NULL,
    found_at     INTEGER NOT NULL,
    -- Set when an operator marks the discrepancy handled (the console).
    resolved_at  INTEGER,
    resolved_by  TEXT,

    CONSTRAINT payments_ledger_discrepancies_kind_check CHECK (kind IN ('no_payment', 'payment_failed'))
) STRICT;

CREATE INDEX payments_ledger_discrepancies_found_idx ON payments_ledger_discrepancies (found_at);
