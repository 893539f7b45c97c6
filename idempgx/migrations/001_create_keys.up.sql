-- The idempotency records, one row per (scope, endpoint, key). Identities
-- compare and sort by bytes (COLLATE "C"), whatever the database's locale.
-- {{schema}} is replaced by the store's quoted schema name. With
-- Config.Partitions = N, the table is PARTITION BY HASH (scope) and N
-- partitions idem_keys_p0 … follow the indexes (which every partition
-- gets); otherwise both placeholders are replaced by nothing.
CREATE TABLE {{schema}}.idem_keys (
    scope               text        COLLATE "C" NOT NULL,
    endpoint            text        COLLATE "C" NOT NULL,
    key                 text        COLLATE "C" NOT NULL,
    fingerprint         text        NOT NULL,
    state               text        NOT NULL,
    token               text        NOT NULL,
    locked_until        timestamptz NOT NULL,
    started_at          timestamptz NOT NULL,
    lease_expired_state text        NOT NULL,
    response_status     integer,
    response_header     jsonb,
    response_body       bytea,
    not_replayable      boolean     NOT NULL DEFAULT false,
    recovery_point      text        NOT NULL DEFAULT '',
    attempts            integer     NOT NULL DEFAULT 1,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,

    CONSTRAINT idem_keys_pkey PRIMARY KEY (scope, endpoint, key),
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
    CONSTRAINT idem_keys_attempts_check CHECK (attempts > 0)
){{partition_by}};

-- The reaper deletes finished records past their retention.
CREATE INDEX idem_keys_reap_idx ON {{schema}}.idem_keys (expires_at)
    WHERE state <> 'in_progress';

-- The sweeper finds in-progress records whose lease expired (and the reaper
-- the rare in-progress record past its retention).
CREATE INDEX idem_keys_sweep_idx ON {{schema}}.idem_keys (locked_until)
    WHERE state = 'in_progress';
{{partitions}}
