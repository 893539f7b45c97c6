DROP INDEX IF EXISTS idem_keys_reap_idx;
CREATE INDEX idem_keys_reap_idx ON idem_keys (expires_at);
DROP INDEX IF EXISTS idem_keys_reconcile_idx;
ALTER TABLE idem_keys DROP COLUMN reconcile_error;
ALTER TABLE idem_keys DROP COLUMN reconcile_attempts;
ALTER TABLE idem_keys DROP COLUMN reconcile_after;
ALTER TABLE idem_keys DROP COLUMN ttl;
