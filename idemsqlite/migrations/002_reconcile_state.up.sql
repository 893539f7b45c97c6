-- ttl is the retention a record was reserved with (microseconds): an
-- unknown record never expires, and when it is settled its retention starts
-- again at now + ttl. Existing records keep the retention they were made
-- with.
ALTER TABLE idem_keys ADD COLUMN ttl INTEGER NOT NULL DEFAULT 0
    CONSTRAINT idem_keys_ttl_check CHECK (ttl >= 0);
UPDATE idem_keys SET ttl = max(expires_at - created_at, 0);

-- The reconciliation state of an unknown record, kept in the store so that
-- any process carries on where another stopped: when it may next be asked
-- about (0: at once), how many attempts failed, the last error (short).
ALTER TABLE idem_keys ADD COLUMN reconcile_after INTEGER NOT NULL DEFAULT 0;
ALTER TABLE idem_keys ADD COLUMN reconcile_attempts INTEGER NOT NULL DEFAULT 0
    CONSTRAINT idem_keys_reconcile_attempts_check CHECK (reconcile_attempts >= 0);
ALTER TABLE idem_keys ADD COLUMN reconcile_error TEXT NOT NULL DEFAULT ''
    CONSTRAINT idem_keys_reconcile_error_check CHECK (length(CAST(reconcile_error AS BLOB)) <= 256);

-- Reconcilers claim the due unknown records; the backlog counts them.
CREATE INDEX idem_keys_reconcile_idx ON idem_keys (reconcile_after, updated_at)
    WHERE state = 'unknown';

-- The reaper deletes only settled records (and the rare in-progress record
-- past its retention, found through idem_keys_sweep_idx): its index leaves
-- out the unknown ones, which never expire, so that a backlog of them is
-- never scanned again by every batch.
DROP INDEX idem_keys_reap_idx;
CREATE INDEX idem_keys_reap_idx ON idem_keys (expires_at)
    WHERE state IN ('completed', 'released');
