-- ttl is the retention a record was reserved with: an unknown record never
-- expires, and when it is settled its retention starts again at now + ttl.
-- NULL (records made before this migration) means expires_at - created_at,
-- so the upgrade rewrites no row.
--
-- reconcile_after, reconcile_attempts and reconcile_error are the
-- reconciliation state of an unknown record, kept in the store so that any
-- node carries on where another stopped: when it may next be asked about
-- (NULL: at once), how many attempts failed, the last error (short).
ALTER TABLE {{schema}}.idem_keys
    ADD COLUMN ttl interval,
    ADD COLUMN reconcile_after timestamptz,
    ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0,
    ADD COLUMN reconcile_error text NOT NULL DEFAULT '',
    ADD CONSTRAINT idem_keys_ttl_check CHECK (ttl >= interval '0'),
    ADD CONSTRAINT idem_keys_reconcile_attempts_check CHECK (reconcile_attempts >= 0),
    ADD CONSTRAINT idem_keys_reconcile_error_check CHECK (octet_length(reconcile_error) <= 256);

-- Reconcilers claim the due unknown records; the backlog counts them.
CREATE INDEX idem_keys_reconcile_idx ON {{schema}}.idem_keys
    (reconcile_after NULLS FIRST, updated_at) WHERE state = 'unknown';

-- The reaper deletes only settled records: its index leaves out the unknown
-- ones, which never expire, so that a backlog of them is never scanned again
-- by every batch.
DROP INDEX {{schema}}.idem_keys_reap_idx;
CREATE INDEX idem_keys_reap_idx ON {{schema}}.idem_keys (expires_at)
    WHERE state IN ('completed', 'released');
