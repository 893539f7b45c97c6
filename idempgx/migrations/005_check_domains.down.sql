ALTER TABLE {{schema}}.idem_keys
    ALTER COLUMN state TYPE text,
    ALTER COLUMN lease_expired_state TYPE text,
    ALTER COLUMN response_status TYPE integer,
    ALTER COLUMN attempts TYPE integer,
    ALTER COLUMN reconcile_attempts TYPE integer,
    ALTER COLUMN reconcile_error TYPE text,
    ALTER COLUMN ttl TYPE interval,
    ADD CONSTRAINT idem_keys_state_check
        CHECK (state IN ('in_progress', 'completed', 'released', 'unknown')),
    ADD CONSTRAINT idem_keys_lease_expired_state_check
        CHECK (lease_expired_state IN ('unknown', 'released')),
    ADD CONSTRAINT idem_keys_response_status_check
        CHECK (response_status BETWEEN 100 AND 999),
    ADD CONSTRAINT idem_keys_attempts_check CHECK (attempts > 0),
    ADD CONSTRAINT idem_keys_reconcile_attempts_check CHECK (reconcile_attempts >= 0),
    ADD CONSTRAINT idem_keys_reconcile_error_check CHECK (octet_length(reconcile_error) <= 256),
    ADD CONSTRAINT idem_keys_ttl_check CHECK (ttl >= interval '0');
DROP DOMAIN {{schema}}.idem_state;
DROP DOMAIN {{schema}}.idem_lease_expired_state;
DROP DOMAIN {{schema}}.idem_response_status;
DROP DOMAIN {{schema}}.idem_attempts;
DROP DOMAIN {{schema}}.idem_reconcile_attempts;
DROP DOMAIN {{schema}}.idem_reconcile_error;
DROP DOMAIN {{schema}}.idem_ttl;
