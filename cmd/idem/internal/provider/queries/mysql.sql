-- The provider's ledger on MySQL 8 or MariaDB 10.6+, in the connection's
-- database. Each statement starts with a "-- name: X" line; arguments are
-- positional (?); times are UTC DATETIME(6) from the provider's clock.

-- name: create
-- The ledger is one table that only ever grows; it is created when missing.
-- UNIQUE (idempotency_key) is the second line of defence behind the idem
-- middleware: a key whose idempotency record expired still finds its charge.
-- Ids and keys are VARBINARY: compared byte for byte.
CREATE TABLE IF NOT EXISTS provider_charges (
    seq             BIGINT         NOT NULL AUTO_INCREMENT,
    id              VARBINARY(255) NOT NULL,
    idempotency_key VARBINARY(255) NOT NULL,
    amount_cents    BIGINT         NOT NULL,
    currency        VARCHAR(3) CHARACTER SET ascii COLLATE ascii_bin NOT NULL,
    reference       VARBINARY(255) NOT NULL,
    created_at      DATETIME(6)    NOT NULL,

    CONSTRAINT provider_charges_pkey PRIMARY KEY (seq),
    CONSTRAINT provider_charges_id_key UNIQUE (id),
    CONSTRAINT provider_charges_idempotency_key_key UNIQUE (idempotency_key),
    CONSTRAINT provider_charges_amount_cents_check CHECK (amount_cents > 0),
    CONSTRAINT provider_charges_currency_check CHECK (CHAR_LENGTH(currency) = 3)
) ENGINE = InnoDB

-- name: insert
-- Inserts a charge; a charge with the key already is error 1062 (the
-- statement alone is undone, the transaction goes on). id,
-- idempotency_key, amount_cents, currency, reference, created_at.
INSERT INTO provider_charges (id, idempotency_key, amount_cents, currency, reference, created_at)
VALUES (?, ?, ?, ?, ?, ?)

-- name: get_by_key
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE idempotency_key = ?

-- name: get_by_id
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE id = ?

-- name: list
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges ORDER BY seq

-- name: page
-- At most limit charges with a seq above after, in ledger order. after,
-- limit.
SELECT seq, id, idempotency_key, amount_cents, currency, reference, created_at
FROM provider_charges WHERE seq > ? ORDER BY seq LIMIT ?
