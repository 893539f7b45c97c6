-- The idempotency records, one row per (scope, endpoint, idem_key).
-- Identities, fingerprints and tokens are VARBINARY: they compare and sort
-- byte for byte whatever the server's collations (the default ones are
-- case-insensitive and pad spaces, which would make Order-1, order-1 and
-- "order-1 " one key). Times are UTC DATETIME(6) (microseconds), ttl is in
-- microseconds. The three identity columns together fill InnoDB's limit of
-- 3072 bytes for an index key: the endpoint gets most (idem proxy's is the
-- method and the raw path), a key is at most 255 characters. CHECK constraints are enforced by MySQL
-- 8.0.16+ and MariaDB 10.2+.
CREATE TABLE idem_keys (
    scope               VARBINARY(512)  NOT NULL,
    endpoint            VARBINARY(2048) NOT NULL,
    idem_key            VARBINARY(512)  NOT NULL,
    fingerprint         VARBINARY(255)  NOT NULL,
    state               VARBINARY(16)   NOT NULL,
    token               VARBINARY(255)  NOT NULL,
    locked_until        DATETIME(6)     NOT NULL,
    started_at          DATETIME(6)     NOT NULL,
    lease_expired_state VARBINARY(16)   NOT NULL,
    response_status     INT             NULL,
    response_header     MEDIUMBLOB      NULL,
    response_body       LONGBLOB        NULL,
    not_replayable      BOOLEAN         NOT NULL DEFAULT FALSE,
    recovery_point      VARBINARY(1024) NOT NULL DEFAULT '',
    attempts            INT             NOT NULL DEFAULT 1,
    created_at          DATETIME(6)     NOT NULL,
    updated_at          DATETIME(6)     NOT NULL,
    expires_at          DATETIME(6)     NOT NULL,
    ttl                 BIGINT          NOT NULL,
    reconcile_after     DATETIME(6)     NULL,
    reconcile_attempts  INT             NOT NULL DEFAULT 0,
    reconcile_error     VARBINARY(256)  NOT NULL DEFAULT '',

    CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, endpoint, idem_key),
    CONSTRAINT idem_keys_state_check
        CHECK (state IN ('in_progress', 'completed', 'released', 'unknown')),
    CONSTRAINT idem_keys_lease_expired_state_check
        CHECK (lease_expired_state IN ('unknown', 'released')),
    CONSTRAINT idem_keys_response_status_check
        CHECK (response_status BETWEEN 100 AND 999),
    -- Only a completed record carries a response or the not-replayable mark,
    -- and a completed record has one of the two.
    CONSTRAINT idem_keys_response_check
        CHECK (CASE WHEN state = 'completed'
                    THEN response_status IS NOT NULL OR not_replayable
                    ELSE response_status IS NULL AND response_header IS NULL
                         AND response_body IS NULL AND NOT not_replayable
               END),
    CONSTRAINT idem_keys_attempts_check CHECK (attempts > 0),
    CONSTRAINT idem_keys_ttl_check CHECK (ttl >= 0),
    CONSTRAINT idem_keys_reconcile_attempts_check CHECK (reconcile_attempts >= 0),

    -- The sweeper finds in-progress records whose lease expired (and the
    -- reaper the rare in-progress record past its retention).
    INDEX idem_keys_sweep_idx (state, locked_until),
    -- The reaper deletes settled records past their retention.
    INDEX idem_keys_reap_idx (state, expires_at),
    -- Reconcilers claim the due unknown records; the backlog counts them.
    INDEX idem_keys_reconcile_idx (state, reconcile_after, updated_at)
) ENGINE = InnoDB ROW_FORMAT = DYNAMIC;
