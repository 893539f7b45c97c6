-- Reconciliation from the provider's side: the ledger is read page by page
-- from a watermark, and charges that match no succeeded payment are kept.
-- {{schema}} is the quoted schema name and a dot.

-- The one row of the watermark: every charge up to seq was checked.
CREATE TABLE {{schema}}payments_ledger_watermark (
    id         integer     NOT NULL,
    seq        bigint      NOT NULL,
    updated_at timestamptz NOT NULL,

    CONSTRAINT payments_ledger_watermark_pkey PRIMARY KEY (id),
    CONSTRAINT payments_ledger_watermark_id_check CHECK (id = 1),
    CONSTRAINT payments_ledger_watermark_seq_check CHECK (seq >= 0)
);

-- Charges with no payment (no_payment) or whose payment failed
-- (payment_failed): money taken, customer told no. One row per charge.
CREATE TABLE {{schema}}payments_ledger_discrepancies (
    charge_id    text        NOT NULL,
    charge_seq   bigint      NOT NULL,
    kind         text        NOT NULL,
    -- The charge's reference: the payment's id when the service made it.
    reference    text        NOT NULL,
    payment_id   text,
    tenant       text,
    amount_cents bigint      NOT NULL,
    currency     text        NOT NULL,
    charged_at   timestamptz NOT NULL,
    found_at     timestamptz NOT NULL,
    -- Set when an operator marks the discrepancy handled (the console).
    resolved_at  timestamptz,
    resolved_by  text,

    CONSTRAINT payments_ledger_discrepancies_pkey PRIMARY KEY (charge_id),
    CONSTRAINT payments_ledger_discrepancies_kind_check CHECK (kind IN ('no_payment', 'payment_failed'))
);

CREATE INDEX payments_ledger_discrepancies_found_idx ON {{schema}}payments_ledger_discrepancies (found_at);
