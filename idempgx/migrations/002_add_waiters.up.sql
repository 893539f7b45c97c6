-- waiters is set by a request that waits for an in-progress record
-- (Store.KeyWait); the statements that finish the attempt send a
-- notification only when it is set, so the common path never pays for
-- NOTIFY's commit-time lock.
ALTER TABLE {{schema}}.idem_keys
    ADD COLUMN waiters boolean NOT NULL DEFAULT false;
