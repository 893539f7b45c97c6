-- The transactional outbox: rows are inserted in the caller's business
-- transaction and delivered afterwards by the relay. Times are integer unix
-- microseconds.
CREATE TABLE idem_outbox (
    id              INTEGER NOT NULL CONSTRAINT idem_outbox_pkey PRIMARY KEY AUTOINCREMENT,
    topic           TEXT    NOT NULL,
    payload         TEXT    NOT NULL,
    -- The key the downstream deduplicates on (derived from the client's
    -- key): every delivery attempt of the row sends the same one.
    idempotency_key TEXT    NOT NULL,
    attempts        INTEGER NOT NULL DEFAULT 0,
    available_at    INTEGER NOT NULL,
    claimed_until   INTEGER,
    state           TEXT    NOT NULL DEFAULT 'pending',
    last_error      TEXT,
    created_at      INTEGER NOT NULL,
    updated_at      INTEGER NOT NULL,

    CONSTRAINT idem_outbox_topic_idempotency_key_key UNIQUE (topic, idempotency_key),
    CONSTRAINT idem_outbox_state_check CHECK (state IN ('pending', 'done', 'dead')),
    CONSTRAINT idem_outbox_payload_check CHECK (json_valid(payload)),
    CONSTRAINT idem_outbox_topic_check CHECK (topic <> '' AND length(topic) <= 255),
    CONSTRAINT idem_outbox_idempotency_key_check
        CHECK (idempotency_key <> '' AND length(idempotency_key) <= 255),
    CONSTRAINT idem_outbox_attempts_check CHECK (attempts >= 0),
    -- Only a pending row can be claimed.
    CONSTRAINT idem_outbox_claim_check CHECK (state = 'pending' OR claimed_until IS NULL)
) STRICT;

-- The relay claims pending rows in the order they became due.
CREATE INDEX idem_outbox_due_idx ON idem_outbox (available_at, id)
    WHERE state = 'pending';

-- Prune deletes delivered rows once they are old enough.
CREATE INDEX idem_outbox_done_idx ON idem_outbox (updated_at)
    WHERE state = 'done';

-- Operators list the dead letters.
CREATE INDEX idem_outbox_dead_idx ON idem_outbox (id)
    WHERE state = 'dead';
