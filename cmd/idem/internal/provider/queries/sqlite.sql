-- The provider's ledger on SQLite. Each statement starts with a
-- "-- name: X" line; times are unix microseconds from the provider's clock.

-- name: create
-- The ledger is one table that only ever grows; it is created when missing.
-- UNIQUE (idempotency_key) is the second line of defence behind the idem
-- middleware: a key whose idempotency record expired still finds its charge.
CREATE TABLE IF NOT EXISTS provider_charges (
    seq             INTEGER NOT NULL CONSTRAINT provider_charges_pkey PRIMARY KEY AUTOINCREMENT,
    id              TEXT    NOT NULL,
    idempotency_key TEXT    NOT NULL,
    amount_cents    INTEGER NOT NULL,
    currency        TEXT    NOT NULL,
    reference       TEXT    NOT NULL,
    created_at      INTEGER NOT NULL,

    CONSTRAINT provider_charges_id_key UNIQUE (id),
    CONSTRAINT provider_charges_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT provider_charges_amount_cents_check CHECK (amount_cents > 0),
    CONSTRAINT provider_charges_currency_check CHECK (length(currency) = 3)
) STRICT;

-- name: insert
-- Inserts a charge unless one has the key: then no row is returned.
-- ?1 id, ?2 idempotency_key, ?3 amount_cents, ?4 currency, ?5 reference,
-- ?6 created_at.
INSERT INTO provider_charges (id, idempotency_key, amount_cents, currency, reference, created_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?6)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING seq

-- name: get_by_key
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE idempotency_key = ?1

-- name: get_by_id
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE id = ?1

-- name: list
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges ORDER BY seq

-- name: page
-- At most ?2 charges with a seq above ?1, in ledger order.
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE seq > ?1 ORDER BY seq LIMIT ?2
