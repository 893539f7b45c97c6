-- Statements of the MySQL outbox store (MySQL 8, MariaDB 10.6+). Each
-- starts with a "-- name: X" line; {{columns}} is replaced by the message's
-- column list (as read by scanMySQLMessages). Parameters are positional
-- (?), in the order each statement's comment gives. Time is always a
-- parameter from the caller's clock, never NOW().

-- name: enqueue
-- topic, payload, idempotency_key, available_at, now, now.
INSERT INTO idem_outbox (topic, payload, idempotency_key, available_at,
    created_at, updated_at)
VALUES (?, ?, ?, ?, ?, ?)

-- name: claim_lock
-- Locks at most limit due rows for a claim, in the order they became due;
-- SKIP LOCKED lets concurrent relays lock disjoint batches, and a row that
-- another relay claimed and committed is re-read (READ COMMITTED) with its
-- live claim, which excludes it. now, now, limit.
SELECT id FROM idem_outbox
WHERE state = 'pending'
  AND available_at <= ?
  AND (claimed_until IS NULL OR claimed_until <= ?)
ORDER BY available_at, id
LIMIT ?
FOR UPDATE SKIP LOCKED

-- name: claim
-- Claims the rows claim_lock locked ({{ids}}) until claimed_until and
-- counts the attempt. claimed_until, now.
UPDATE idem_outbox SET
    claimed_until = ?,
    attempts = attempts + 1,
    updated_at = ?
WHERE id IN ({{ids}})

-- name: get_many
-- The rows of {{ids}}.
SELECT {{columns}} FROM idem_outbox WHERE id IN ({{ids}})

-- name: finish
-- Records the outcome of the attempt numbered attempt, fenced on it: a relay
-- whose claim was taken over changes nothing. state, available_at,
-- last_error, now, id, attempt.
UPDATE idem_outbox SET
    state = ?,
    available_at = ?,
    claimed_until = NULL,
    last_error = ?,
    updated_at = ?
WHERE id = ? AND attempts = ?
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: unclaim
-- Returns a claimed row that was never attempted, uncounting the attempt.
-- now, id, attempt.
UPDATE idem_outbox SET
    claimed_until = NULL,
    attempts = attempts - 1,
    updated_at = ?
WHERE id = ? AND attempts = ?
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: get
-- id.
SELECT {{columns}} FROM idem_outbox WHERE id = ?

-- name: redrive
-- Makes a dead row pending again with a fresh attempt budget. now, now, id.
UPDATE idem_outbox SET
    state = 'pending',
    attempts = 0,
    available_at = ?,
    updated_at = ?
WHERE id = ? AND state = 'dead'

-- name: prune
-- Deletes at most limit done rows last updated before before. before,
-- limit.
DELETE FROM idem_outbox
WHERE state = 'done' AND updated_at < ?
ORDER BY updated_at
LIMIT ?

-- name: list
-- At most limit messages in state (any when empty) with an id above
-- after, in id order. state, state, after, limit.
SELECT {{columns}} FROM idem_outbox
WHERE (? = '' OR state = ?) AND id > ?
ORDER BY id
LIMIT ?

-- name: counts
SELECT state, count(*) FROM idem_outbox GROUP BY state
