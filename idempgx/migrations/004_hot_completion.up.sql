-- A completion (in progress to completed) changes no column that an index
-- names, in its key or its predicate, so that PostgreSQL updates the row in
-- place (a HOT update: no new index entry, half the WAL records). The state
-- and updated_at leave the indexes:
--
-- unknown_since is when an unknown record became unknown (its updated_at,
-- which nothing changes while it stays unknown), NULL for any other record:
-- every statement that moves a record into or out of unknown sets it. (Not
-- a generated column: PostgreSQL reads a generated column's expression
-- again for every row written, as it does a check constraint's.)
ALTER TABLE {{schema}}.idem_keys ADD COLUMN unknown_since timestamptz;
UPDATE {{schema}}.idem_keys SET unknown_since = updated_at WHERE state = 'unknown';

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
