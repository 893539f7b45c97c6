-- A completion (in progress to completed) changes no column that an index
-- names, in its key or its predicate, so that PostgreSQL updates the row in
-- place (a HOT update: no new index entry, a fraction of the WAL). The
-- state and updated_at leave the indexes:
--
-- unknown_since is when an unknown record became unknown (its updated_at,
-- which nothing changes while it stays unknown), NULL for any other; a
-- generated column, so that every way into and out of unknown keeps it, and
-- it is NULL both before and after a completion. Adding it rewrites the
-- table once.
ALTER TABLE {{schema}}.idem_keys
    ADD COLUMN unknown_since timestamptz
        GENERATED ALWAYS AS (CASE WHEN state = 'unknown' THEN updated_at END) STORED;

-- The reaper deletes settled records past their retention: unknown ones,
-- which never expire, stay out of its index, so that a backlog of them is
-- never scanned again by every batch. In-progress records are in it (the
-- rare one past its retention is reaped too).
DROP INDEX {{schema}}.idem_keys_reap_idx;
CREATE INDEX idem_keys_reap_idx ON {{schema}}.idem_keys (expires_at)
    WHERE unknown_since IS NULL;

-- The sweeper finds expired leases by locked_until among all records: it
-- scans from a watermark forward (see KeySweep), so that finished records
-- are not read again by every pass.
DROP INDEX {{schema}}.idem_keys_sweep_idx;
CREATE INDEX idem_keys_sweep_idx ON {{schema}}.idem_keys (locked_until);

-- Reconcilers claim the due unknown records; the backlog counts them.
DROP INDEX {{schema}}.idem_keys_reconcile_idx;
CREATE INDEX idem_keys_reconcile_idx ON {{schema}}.idem_keys
    (reconcile_after NULLS FIRST, unknown_since) WHERE unknown_since IS NOT NULL;
