DROP INDEX IF EXISTS idem_keys_reconcile_idx;
ALTER TABLE idem_keys DROP COLUMN reconcile_error;
ALTER TABLE idem_keys DROP COLUMN reconcile_attempts;
ALTER TABLE idem_keys DROP COLUMN reconcile_after;
ALTER TABLE idem_keys DROP COLUMN ttl;
