-- The transactional outbox on MySQL 8 or MariaDB 10.6+: rows are inserted
-- in the caller's business transaction and delivered afterwards by the
-- relay. The table lives in the connection's database. Topics and keys are
-- VARBINARY, compared byte for byte whatever the server's collations; the
-- payload is JSON text, kept as it was enqueued. One statement: MySQL
-- commits DDL at once.
CREATE TABLE idem_outbox (
    id              BIGINT        NOT NULL AUTO_INCREMENT,
    topic           VARBINARY(255) NOT NULL,
    payload         LONGTEXT CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL,
    -- The key the downstream deduplicates on (derived from the client's
    -- key): every delivery attempt of the row sends the same one.
    idempotency_key VARBINARY(255) NOT NULL,
    attempts        INT           NOT NULL DEFAULT 0,
    available_at    DATETIME(6)   NOT NULL,
    claimed_until   DATETIME(6)   NULL,
    state           VARCHAR(16) CHARACTER SET ascii COLLATE ascii_bin NOT NULL DEFAULT 'pending',
    last_error      TEXT          NULL,
    created_at      DATETIME(6)   NOT NULL,
    updated_at      DATETIME(6)   NOT NULL,

    CONSTRAINT idem_outbox_pkey PRIMARY KEY (id),
    CONSTRAINT idem_outbox_topic_idempotency_key_key UNIQUE (topic, idempotency_key),
    CONSTRAINT idem_outbox_state_check CHECK (state IN ('pending', 'done', 'dead')),
    CONSTRAINT idem_outbox_payload_check CHECK (JSON_VALID(payload)),
    CONSTRAINT idem_outbox_topic_check CHECK (topic <> ''),
    CONSTRAINT idem_outbox_idempotency_key_check CHECK (idempotency_key <> ''),
    CONSTRAINT idem_outbox_attempts_check CHECK (attempts >= 0),
    -- Only a pending row can be claimed.
    CONSTRAINT idem_outbox_claim_check CHECK (state = 'pending' OR claimed_until IS NULL),

    -- The relay claims pending rows in the order they became due.
    INDEX idem_outbox_due_idx (state, available_at, id),
    -- Prune deletes delivered rows once they are old enough.
    INDEX idem_outbox_done_idx (state, updated_at)
) ENGINE = InnoDB;
