DROP INDEX {{schema}}.idem_keys_reap_idx;
CREATE INDEX idem_keys_reap_idx ON {{schema}}.idem_keys (expires_at)
    WHERE state <> 'in_progress';
DROP INDEX {{schema}}.idem_keys_reconcile_idx;
ALTER TABLE {{schema}}.idem_keys
    DROP COLUMN reconcile_error,
    DROP COLUMN reconcile_attempts,
    DROP COLUMN reconcile_after,
    DROP COLUMN ttl;
