-- The provider's ledger on PostgreSQL. Each statement starts with a
-- "-- name: X" line; {{schema}} is replaced by the quoted schema name.

-- name: create
-- The ledger is one table that only ever grows; it is created when missing.
-- UNIQUE (idempotency_key) is the second line of defence behind the idem
-- middleware: a key whose idempotency record expired still finds its charge.
CREATE TABLE IF NOT EXISTS {{schema}}.provider_charges (
    seq             bigint      GENERATED ALWAYS AS IDENTITY,
    id              text        NOT NULL,
    idempotency_key text        NOT NULL,
    amount_cents    bigint      NOT NULL,
    currency        text        NOT NULL,
    reference       text        NOT NULL,
    created_at      timestamptz NOT NULL,

    CONSTRAINT provider_charges_pkey PRIMARY KEY (seq),
    CONSTRAINT provider_charges_id_key UNIQUE (id),
    CONSTRAINT provider_charges_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT provider_charges_amount_cents_check CHECK (amount_cents > 0),
    CONSTRAINT provider_charges_currency_check CHECK (length(currency) = 3)
)

-- name: insert
-- Inserts a charge unless one has the key: then no row is returned.
-- $1 id, $2 idempotency_key, $3 amount_cents, $4 currency, $5 reference,
-- $6 created_at.
INSERT INTO {{schema}}.provider_charges (id, idempotency_key, amount_cents, currency, reference, created_at)
VALUES ($1::text, $2::text, $3::bigint, $4::text, $5::text, $6::timestamptz)
ON CONFLICT ON CONSTRAINT provider_charges_idempotency_key_key DO NOTHING
RETURNING seq

-- name: get_by_key
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM {{schema}}.provider_charges WHERE idempotency_key = $1::text

-- name: get_by_id
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM {{schema}}.provider_charges WHERE id = $1::text

-- name: list
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM {{schema}}.provider_charges ORDER BY seq

-- name: page
-- At most $2 charges with a seq above $1, in ledger order.
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM {{schema}}.provider_charges WHERE seq > $1::bigint ORDER BY seq LIMIT $2::integer
