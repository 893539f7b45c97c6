-- Statements of the PostgreSQL outbox store. Each starts with a "-- name: X"
-- line; {{columns}} is replaced by the message's column list (as read by
-- scanMessage) and {{schema}} by the quoted schema name and a dot, or by
-- nothing: then tables are found through the connection's search_path.
-- Time is always a parameter from the caller's clock, never now().

-- name: enqueue
-- $1 topic, $2 payload, $3 idempotency_key, $4 available_at, $5 now.
INSERT INTO {{schema}}idem_outbox (topic, payload, idempotency_key, available_at,
    created_at, updated_at)
VALUES ($1::text, $2::jsonb, $3::text, $4::timestamptz, $5::timestamptz,
    $5::timestamptz)
RETURNING id

-- name: claim
-- Claims at most $3 due rows until $2 and counts the attempt. SKIP LOCKED
-- lets concurrent relays claim disjoint batches; under READ COMMITTED a row
-- that another relay claimed and committed after this statement's snapshot
-- is re-checked against the WHERE clause when it is locked, so its live
-- claim excludes it. $1 now, $2 claimed_until, $3 limit.
WITH due AS (
    SELECT id FROM {{schema}}idem_outbox
    WHERE state = 'pending'
      AND available_at <= $1::timestamptz
      AND (claimed_until IS NULL OR claimed_until <= $1::timestamptz)
    ORDER BY available_at, id
    LIMIT $3::integer
    FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}idem_outbox AS o SET
    claimed_until = $2::timestamptz,
    attempts = o.attempts + 1,
    updated_at = $1::timestamptz
FROM due
WHERE o.id = due.id
RETURNING {{columns}}

-- name: finish
-- Records the outcome of the attempt numbered $2, fenced on it: a relay
-- whose claim was taken over changes nothing. $1 id, $3 state,
-- $4 available_at, $5 last_error, $6 now.
UPDATE {{schema}}idem_outbox SET
    state = $3::text,
    available_at = $4::timestamptz,
    claimed_until = NULL,
    last_error = $5::text,
    updated_at = $6::timestamptz
WHERE id = $1::bigint AND attempts = $2::integer
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: unclaim
-- Returns a claimed row that was never attempted, uncounting the attempt.
-- $1 id, $2 attempt, $3 now.
UPDATE {{schema}}idem_outbox SET
    claimed_until = NULL,
    attempts = attempts - 1,
    updated_at = $3::timestamptz
WHERE id = $1::bigint AND attempts = $2::integer
  AND state = 'pending' AND claimed_until IS NOT NULL

-- name: get
-- $1 id.
SELECT {{columns}} FROM {{schema}}idem_outbox AS o WHERE o.id = $1::bigint

-- name: redrive
-- Makes a dead row pending again with a fresh attempt budget. $1 id, $2 now.
UPDATE {{schema}}idem_outbox SET
    state = 'pending',
    attempts = 0,
    available_at = $2::timestamptz,
    updated_at = $2::timestamptz
WHERE id = $1::bigint AND state = 'dead'

-- name: prune
-- Deletes at most $2 done rows last updated before $1.
DELETE FROM {{schema}}idem_outbox
WHERE id IN (
    SELECT id FROM {{schema}}idem_outbox
    WHERE state = 'done' AND updated_at < $1::timestamptz
    ORDER BY updated_at
    LIMIT $2::integer
)

-- name: list
-- At most $3 messages in state $1 (any when empty) with an id above $2, in
-- id order.
SELECT {{columns}} FROM {{schema}}idem_outbox AS o
WHERE ($1::text = '' OR o.state = $1::text) AND o.id > $2::bigint
ORDER BY o.id
LIMIT $3::integer

-- name: counts
SELECT state, count(*) FROM {{schema}}idem_outbox GROUP BY state
