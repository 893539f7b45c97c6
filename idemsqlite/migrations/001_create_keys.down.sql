DROP INDEX IF EXISTS idem_keys_reap_idx;
DROP INDEX IF EXISTS idem_keys_sweep_idx;
DROP TABLE IF EXISTS idem_keys;
