-- Statements of the SQLite outbox store. Each starts with a "-- name: X"
-- line; {{columns}} is replaced by the message's column list (as read by
-- scanMessage). Parameters are numbered so a statement can use one twice;
-- times are unix microseconds from the caller's clock.

-- name: enqueue
-- ?1 topic, ?2 payload, ?3 idempotency_key, ?4 available_at, ?5 now.
INSERT INTO idem_outbox (topic, payload, idempotency_key, available_at,
    created_at, updated_at)
VALUES (?1, ?2, ?3, ?4, ?5, ?5)
RETURNING id

-- name: claim
-- Claims at most ?3 due rows until ?2 and counts the attempt. One UPDATE is
-- atomic under SQLite's single writer, so concurrent relays (connections or
-- processes) claim disjoint rows. RETURNING does not order: the caller
-- sorts. ?1 now, ?2 claimed_until, ?3 limit.
UPDATE idem_outbox SET
    claimed_until = ?2,
    attempts = attempts + 1,
    updated_at = ?1
WHERE id IN (
    SELECT id FROM idem_outbox
    WHERE state = 'pending'
      AND available_at <= ?1
      AND (claimed_until IS NULL OR claimed_until <= ?1)
    ORDER BY available_at, id
    LIMIT ?3
)
RETURNING {{columns}}

-- name: finish
-- Records the outcome of the attempt numbered ?2, fenced on it: a relay
-- whose claim was taken over changes nothing. ?1 id, ?3 state,
-- ?4 available_at, ?5 last_error, ?6 now.
UPDATE idem_outbox SET
    state = ?3,
    available_at = ?4,
    claimed_until = NULL,
    last_error = ?5,
    updated_at = ?6
WHERE id = ?1 AND attempts = ?2
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: unclaim
-- Returns a claimed row that was never attempted, uncounting the attempt.
-- ?1 id, ?2 attempt, ?3 now.
UPDATE idem_outbox SET
    claimed_until = NULL,
    attempts = attempts - 1,
    updated_at = ?3
WHERE id = ?1 AND attempts = ?2
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: get
-- ?1 id.
SELECT {{columns}} FROM idem_outbox WHERE id = ?1

-- name: redrive
-- Makes a dead row pending again with a fresh attempt budget. ?1 id, ?2 now.
UPDATE idem_outbox SET
    state = 'pending',
    attempts = 0,
    available_at = ?2,
    updated_at = ?2
WHERE id = ?1 AND state = 'dead'

-- name: prune
-- Deletes at most ?2 done rows last updated before ?1.
DELETE FROM idem_outbox
WHERE id IN (
    SELECT id FROM idem_outbox
    WHERE state = 'done' AND updated_at < ?1
    ORDER BY updated_at
    LIMIT ?2
)

-- name: list
-- At most ?3 messages in state ?1 (any when empty) with an id above ?2, in
-- id order.
SELECT {{columns}} FROM idem_outbox
WHERE (?1 = '' OR state = ?1) AND id > ?2
ORDER BY id
LIMIT ?3

-- name: counts
SELECT state, count(*) FROM idem_outbox GROUP BY state
