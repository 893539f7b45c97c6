DROP INDEX {{schema}}.idem_keys_reconcile_idx;
DROP INDEX {{schema}}.idem_keys_sweep_idx;
DROP INDEX {{schema}}.idem_keys_reap_idx;
ALTER TABLE {{schema}}.idem_keys DROP COLUMN unknown_since;
CREATE INDEX idem_keys_reap_idx ON {{schema}}.idem_keys (expires_at)
    WHERE state IN ('completed', 'released');
CREATE INDEX idem_keys_sweep_idx ON {{schema}}.idem_keys (locked_until)
    WHERE state = 'in_progress';
CREATE INDEX idem_keys_reconcile_idx ON {{schema}}.idem_keys
    (reconcile_after NULLS FIRST, updated_at) WHERE state = 'unknown';
