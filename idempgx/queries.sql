-- Statements of the PostgreSQL store. Each starts with a "-- name: X" line.
-- {{schema}} is replaced by the store's quoted schema name, {{columns}} by
-- the record's column list (as read by recordScan), {{channel}} by the
-- store's notification channel and {{notify_payload}} by the hash of the
-- identity of a row u (see notifyPayload), {{notify_payload_k}} of a row k. Time is always a parameter from
-- the store's clock, never the server's now().
--
-- The statements that finish an attempt send a notification (pg_notify)
-- only when a request waits for the record (waiters, set by wait): NOTIFY
-- serializes committing transactions, which the common path must not pay.

-- name: reserve
-- The common path, sent with "find" in one pipeline: one round trip, one
-- implicit transaction (KeyReserve). A plain insert of a new record that
-- does nothing when the key is there: a replay writes nothing (the primary
-- key's probe finds the row before any write) and a record is never
-- overwritten. It returns no row; the command tag says whether it
-- inserted, and a new record is the one the caller built. When it inserted
-- nothing, "find" reads the existing record without locking it; a record
-- that "reclaim" would write (past its retention, released with the same
-- fingerprint, an expired lease) is returned unwritten and KeyReserve then
-- runs "reclaim" (a rare path). Two plain statements instead of one with a
-- CTE and a UNION: PostgreSQL sets up every node of a plan on every
-- execution, and the single statement cost the server about 97,000 more
-- instructions per new key (reserve and completion, pginstructions.sh) for
-- the same cost of a replay.
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 fingerprint, $6 now,
-- $7 locked_until, $8 expires_at, $9 lease_expired_state, $10 ttl.
INSERT INTO {{schema}}.idem_keys AS k (
    scope, endpoint, key, fingerprint, state, token, locked_until,
    started_at, lease_expired_state, attempts, created_at, updated_at,
    expires_at, ttl)
VALUES ($1::text, $2::text, $3::text, $5::text, 'in_progress', $4::text,
    $7::timestamptz, $6::timestamptz, $9::text, 1, $6::timestamptz,
    $6::timestamptz, $8::timestamptz, $10::interval)
ON CONFLICT ON CONSTRAINT idem_keys_pkey DO NOTHING;

-- name: find
-- The record of a key as it stands, whatever its state, for "reserve",
-- unless its token is the caller's: a token is new for each reservation, so
-- the record holds it exactly when "reserve" inserted it, and the caller
-- built that record. A new key then forms and sends no row (about 20,000
-- fewer instructions of the server per new key, pgbench in a pipeline
-- under callgrind; some 65,000 in pginstructions.sh's single-user backend).
-- $1 scope, $2 endpoint, $3 key, $4 token.
SELECT {{columns}}
FROM {{schema}}.idem_keys AS k
WHERE k.scope = $1::text AND k.endpoint = $2::text AND k.key = $3::text
  AND k.token <> $4::text;

-- name: reserve_many
-- "reserve" for several calls of a group (Config.GroupCommit) in one
-- statement, sent with "find_many": each parameter is an array, element i
-- the i-th call's (the calls in the order of their identities, which is
-- the order the rows are written and locked in). A statement's set-up and
-- end (bind, executor start-up, the check's expression) are paid once per
-- group instead of once per call: some 125,000 fewer instructions of the
-- server per new key in groups of four (scripts/bench/pgmultirow.sh). It
-- returns the token of each record it inserted: a token is new for each
-- reservation, so it names the call. generate_subscripts, not unnest: the
-- planner's estimate of its rows does not depend on the arrays, so that
-- the plan cache keeps one generic plan instead of planning each
-- execution anew (with unnest, some 290,000 instructions more per new key
-- in groups of four).
-- $1 scopes, $2 endpoints, $3 keys, $4 tokens, $5 fingerprints, $6 nows,
-- $7 locked_untils, $8 expires_ats, $9 lease_expired_states, $10 ttls.
INSERT INTO {{schema}}.idem_keys AS k (
    scope, endpoint, key, fingerprint, state, token, locked_until,
    started_at, lease_expired_state, attempts, created_at, updated_at,
    expires_at, ttl)
SELECT ($1::text[])[i], ($2::text[])[i], ($3::text[])[i], ($5::text[])[i],
    'in_progress', ($4::text[])[i], ($7::timestamptz[])[i],
    ($6::timestamptz[])[i], ($9::text[])[i], 1, ($6::timestamptz[])[i],
    ($6::timestamptz[])[i], ($8::timestamptz[])[i], ($10::interval[])[i]
FROM generate_subscripts($3::text[], 1) AS i
ON CONFLICT ON CONSTRAINT idem_keys_pkey DO NOTHING
RETURNING k.token;

-- name: find_many
-- "find" for the calls of "reserve_many": each record found, with the
-- subscript of its call. The lookup is a lateral subquery kept apart from
-- the join (OFFSET 0), so that every call is one probe of the primary key
-- whatever the table's size and statistics (pulled up into a join, the
-- planner hashes a small table's rows instead).
-- $1 scopes, $2 endpoints, $3 keys, $4 tokens.
SELECT i, k.*
FROM generate_subscripts($3::text[], 1) AS i,
LATERAL (
    SELECT {{columns}}
    FROM {{schema}}.idem_keys AS k
    WHERE k.scope = ($1::text[])[i] AND k.endpoint = ($2::text[])[i]
      AND k.key = ($3::text[])[i] AND k.token <> ($4::text[])[i]
    OFFSET 0) AS k;

-- name: reclaim
-- The whole reservation, run when "reserve" found a record it would write.
-- One statement, one round trip. done finds a live completed record, which
-- nothing below may write: a replay. Only when there is none do the writing
-- branches run (each is gated on NOT EXISTS done, a one-time filter that
-- skips its scan): ins inserts a new record; take re-claims a record past
-- its retention, a released one with the same fingerprint, or an expired
-- lease that turns released; lapse turns any other expired lease into its
-- lease_expired_state. When none of them writes, the last branch reads the
-- existing record without locking it. So a replay is one index lookup and
-- writes nothing.
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 fingerprint, $6 now,
-- $7 locked_until, $8 expires_at, $9 lease_expired_state, $10 ttl.
-- "Past its retention" is an expired record: never an unknown one, nor an
-- expired lease that turns unknown.
WITH done AS (
    SELECT {{columns}}
    FROM {{schema}}.idem_keys AS k
    WHERE k.scope = $1::text AND k.endpoint = $2::text AND k.key = $3::text
      -- A CASE, as in lapse: with plain conditions a generic plan could
      -- scan every live completed record through idem_keys_reap_idx
      -- (whose predicate and key they match) instead of the primary key.
      AND CASE WHEN k.state = 'completed'
               THEN k.expires_at > $6::timestamptz ELSE false END
), ins AS (
    INSERT INTO {{schema}}.idem_keys AS k (
        scope, endpoint, key, fingerprint, state, token, locked_until,
        started_at, lease_expired_state, attempts, created_at, updated_at,
        expires_at, ttl)
    SELECT $1::text, $2::text, $3::text, $5::text, 'in_progress', $4::text,
        $7::timestamptz, $6::timestamptz, $9::text, 1, $6::timestamptz,
        $6::timestamptz, $8::timestamptz, $10::interval
    WHERE NOT EXISTS (SELECT 1 FROM done)
    ON CONFLICT ON CONSTRAINT idem_keys_pkey DO NOTHING
    RETURNING {{columns}}
), take AS (
    UPDATE {{schema}}.idem_keys AS k SET
        fingerprint = $5::text,
        state = 'in_progress',
        token = $4::text,
        locked_until = $7::timestamptz,
        started_at = $6::timestamptz,
        lease_expired_state = CASE WHEN k.expires_at <= $6::timestamptz
            THEN $9::text ELSE k.lease_expired_state END,
        response_status = NULL,
        response_header = NULL,
        response_body = NULL,
        not_replayable = false,
        waiters = false,
        recovery_point = CASE WHEN k.expires_at <= $6::timestamptz
            THEN '' ELSE k.recovery_point END,
        attempts = CASE WHEN k.expires_at <= $6::timestamptz
            THEN 1 ELSE k.attempts + 1 END,
        created_at = CASE WHEN k.expires_at <= $6::timestamptz
            THEN $6::timestamptz ELSE k.created_at END,
        updated_at = $6::timestamptz,
        expires_at = CASE WHEN k.expires_at <= $6::timestamptz
            THEN $8::timestamptz ELSE k.expires_at END,
        ttl = CASE WHEN k.expires_at <= $6::timestamptz
            THEN $10::interval ELSE k.ttl END,
        reconcile_after = NULL,
        reconcile_attempts = 0,
        reconcile_error = '',
        unknown_since = NULL
    WHERE k.scope = $1::text AND k.endpoint = $2::text AND k.key = $3::text
      AND NOT EXISTS (SELECT 1 FROM done)
      AND NOT EXISTS (SELECT 1 FROM ins)
      AND ((k.expires_at <= $6::timestamptz AND k.state <> 'unknown'
            AND NOT (k.state = 'in_progress' AND k.locked_until <= $6::timestamptz
                     AND k.lease_expired_state = 'unknown'))
           OR (k.fingerprint = $5::text
               AND (k.state = 'released'
                    OR (k.state = 'in_progress'
                        AND k.locked_until <= $6::timestamptz
                        AND k.lease_expired_state = 'released'))))
    RETURNING {{columns}}
), lapse AS (
    UPDATE {{schema}}.idem_keys AS k SET
        state = k.lease_expired_state,
        updated_at = $6::timestamptz,
        unknown_since = CASE WHEN k.lease_expired_state = 'unknown'
            THEN $6::timestamptz END
    WHERE k.scope = $1::text AND k.endpoint = $2::text AND k.key = $3::text
      AND NOT EXISTS (SELECT 1 FROM done)
      AND NOT EXISTS (SELECT 1 FROM ins)
      -- One CASE, so that the row is always found by its primary key: with
      -- plain conditions a generic plan made while few leases were in
      -- progress could scan every expired lease through idem_keys_sweep_idx.
      AND CASE WHEN k.state = 'in_progress'
               THEN k.locked_until <= $6::timestamptz
                    AND (k.expires_at > $6::timestamptz
                         OR k.lease_expired_state = 'unknown')
                    AND NOT (k.fingerprint = $5::text
                             AND k.lease_expired_state = 'released')
               ELSE false END
    RETURNING {{columns}}
)
SELECT false, * FROM done
UNION ALL
SELECT true, * FROM ins
UNION ALL
SELECT true, * FROM take
UNION ALL
SELECT false, * FROM lapse
UNION ALL
SELECT false, {{columns}}
FROM {{schema}}.idem_keys AS k
WHERE k.scope = $1::text AND k.endpoint = $2::text AND k.key = $3::text
  AND NOT EXISTS (SELECT 1 FROM done)
  AND NOT EXISTS (SELECT 1 FROM ins)
  AND NOT EXISTS (SELECT 1 FROM take)
  AND NOT EXISTS (SELECT 1 FROM lapse);

-- name: get
-- $1 scope, $2 endpoint, $3 key, $4 now.
SELECT {{columns}}
FROM {{schema}}.idem_keys AS k
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3
  AND (k.expires_at > $4::timestamptz OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= $4::timestamptz
           AND k.lease_expired_state = 'unknown'));

-- name: complete
-- One UPDATE, no CTE: PostgreSQL sets up every node of a plan on every
-- execution, and the CTE form (as "release" below) cost the server some
-- 40,000 more instructions per completion. It returns one row when it
-- completed the record, none otherwise: one column, 1 when it notified
-- waiters, else 0 (a second column, the count of records changed as the
-- other finishing statements return it, cost some 3,000 instructions).
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now, $6 status, $7 header,
-- $8 body, $9 not_replayable.
UPDATE {{schema}}.idem_keys AS k SET
    state = 'completed',
    response_status = $6::integer,
    response_header = $7::jsonb,
    response_body = $8::bytea,
    not_replayable = $9::boolean,
    updated_at = $5::timestamptz,
    unknown_since = NULL,
    expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
               AND k.lease_expired_state = 'unknown'))
        THEN $5::timestamptz + coalesce(k.ttl, k.expires_at - k.created_at)
        ELSE k.expires_at END
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
  AND k.state IN ('in_progress', 'unknown')
  AND (k.expires_at > $5::timestamptz OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
           AND k.lease_expired_state = 'unknown'))
RETURNING
    -- A CASE evaluates pg_notify only for a record with waiters.
    CASE WHEN NOT k.waiters THEN 0::bigint
         WHEN pg_notify({{channel}}, {{notify_payload_k}}) IS NULL THEN 1::bigint
         ELSE 1::bigint END;

-- name: release
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now.
WITH u AS (
    UPDATE {{schema}}.idem_keys AS k SET
        state = 'released',
        updated_at = $5::timestamptz,
        unknown_since = NULL,
        expires_at = CASE WHEN (k.state = 'unknown'
               OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
                   AND k.lease_expired_state = 'unknown'))
            THEN $5::timestamptz + coalesce(k.ttl, k.expires_at - k.created_at)
            ELSE k.expires_at END
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
      AND k.state IN ('in_progress', 'unknown')
      AND (k.expires_at > $5::timestamptz OR k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
               AND k.lease_expired_state = 'unknown'))
    RETURNING k.scope, k.endpoint, k.key, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n);

-- name: mark_unknown
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now.
WITH u AS (
    UPDATE {{schema}}.idem_keys AS k SET
        state = 'unknown',
        updated_at = $5::timestamptz,
        unknown_since = $5::timestamptz
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
      AND k.state = 'in_progress'
      AND (k.expires_at > $5::timestamptz OR k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
               AND k.lease_expired_state = 'unknown'))
    RETURNING k.scope, k.endpoint, k.key, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n);

-- name: delete
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now.
WITH u AS (
    DELETE FROM {{schema}}.idem_keys AS k
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
      AND k.state = 'in_progress'
      AND (k.expires_at > $5::timestamptz OR k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
               AND k.lease_expired_state = 'unknown'))
    RETURNING k.scope, k.endpoint, k.key, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n);

-- name: renew
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now, $6 locked_until.
UPDATE {{schema}}.idem_keys AS k SET
    locked_until = $6::timestamptz,
    updated_at = $5::timestamptz
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
  AND k.state = 'in_progress'
  AND k.expires_at > $5::timestamptz;

-- name: checkpoint
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now, $6 recovery_point.
UPDATE {{schema}}.idem_keys AS k SET
    recovery_point = $6::text,
    updated_at = $5::timestamptz
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
  AND k.state = 'in_progress'
  AND k.expires_at > $5::timestamptz;

-- name: resolve
-- An unknown record, or an in-progress one whose expired lease turns
-- unknown, settles to completed or released.
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now, $6 state, $7 status,
-- $8 header, $9 body, $10 not_replayable.
WITH u AS (
    UPDATE {{schema}}.idem_keys AS k SET
        state = $6::text,
        response_status = $7::integer,
        response_header = $8::jsonb,
        response_body = $9::bytea,
        not_replayable = $10::boolean,
        updated_at = $5::timestamptz,
        unknown_since = NULL,
        expires_at = $5::timestamptz + coalesce(k.ttl, k.expires_at - k.created_at)
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
      AND (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= $5::timestamptz
               AND k.lease_expired_state = 'unknown'))
    RETURNING k.scope, k.endpoint, k.key, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n);

-- name: sweep
-- Turns at most $2 expired leases into their lease_expired_state, skipping
-- rows another transaction holds, and wakes their waiters. The leases are
-- those that expired from $3 (NULL: from the start) to $1: the sweep index
-- holds every record, finished ones too (so that a completion updates none
-- of its entries), and KeySweep scans it from a watermark forward.
-- $1 now, $2 limit, $3 from.
WITH batch AS (
    SELECT scope, endpoint, key
    FROM {{schema}}.idem_keys
    WHERE locked_until <= $1::timestamptz
      AND locked_until >= coalesce($3::timestamptz, '-infinity')
      AND state = 'in_progress'
    ORDER BY locked_until
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), u AS (
    UPDATE {{schema}}.idem_keys AS k SET
        state = k.lease_expired_state,
        updated_at = $1::timestamptz,
        unknown_since = CASE WHEN k.lease_expired_state = 'unknown'
            THEN $1::timestamptz END
    FROM batch AS b
    WHERE k.scope = b.scope AND k.endpoint = b.endpoint AND k.key = b.key
    RETURNING {{columns}}, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT {{columns}}
FROM u AS k
WHERE (SELECT count(*) FROM n) >= 0;

-- name: reap
-- Deletes at most $2 expired records (past their retention, never unknown
-- ones nor expired leases that turn unknown), skipping rows another
-- transaction holds, from idem_keys_reap_idx, which leaves the unknown
-- records out (the statements set unknown_since on every way into unknown;
-- the state is checked besides, for a record written otherwise).
-- $1 now, $2 limit.
WITH batch AS (
    SELECT scope, endpoint, key
    FROM {{schema}}.idem_keys
    WHERE unknown_since IS NULL AND expires_at <= $1::timestamptz
      AND state <> 'unknown'
      AND NOT (state = 'in_progress' AND locked_until <= $1::timestamptz
               AND lease_expired_state = 'unknown')
    ORDER BY expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
DELETE FROM {{schema}}.idem_keys AS k
USING batch AS b
WHERE k.scope = b.scope AND k.endpoint = b.endpoint AND k.key = b.key;

-- name: list
-- Keyset pagination by the primary key. The state filter applies to the
-- state a record is in now (an expired lease counts as its
-- lease_expired_state). $1 now, $2 state, $3 scope, $4 endpoint,
-- $5 created_before (NULL: any), $6 has cursor, $7-$9 cursor, $10 limit.
SELECT {{columns}}
FROM {{schema}}.idem_keys AS k
WHERE (k.expires_at > $1::timestamptz OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= $1::timestamptz
           AND k.lease_expired_state = 'unknown'))
  AND ($2::text = ''
       OR (CASE WHEN k.state = 'in_progress' AND k.locked_until <= $1::timestamptz
                THEN k.lease_expired_state ELSE k.state END) = $2::text)
  AND ($3::text = '' OR k.scope = $3::text)
  AND ($4::text = '' OR k.endpoint = $4::text)
  AND ($5::timestamptz IS NULL OR k.created_at < $5::timestamptz)
  AND (NOT $6::boolean OR (k.scope, k.endpoint, k.key) > ($7::text, $8::text, $9::text))
ORDER BY k.scope, k.endpoint, k.key
LIMIT $10;

-- name: wait
-- Marks a live in-progress record as waited for, so that the statement
-- finishing its attempt notifies. It is true when the record is in
-- progress and marked; false when it changed and the waiter should read it
-- again. $1 scope, $2 endpoint, $3 key, $4 now.
WITH u AS (
    UPDATE {{schema}}.idem_keys AS k SET waiters = true
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3
      AND k.state = 'in_progress' AND NOT k.waiters
      AND k.locked_until > $4::timestamptz AND k.expires_at > $4::timestamptz
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM u)
    OR EXISTS (
        SELECT 1 FROM {{schema}}.idem_keys AS k
        WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3
          AND k.state = 'in_progress' AND k.waiters
          AND k.locked_until > $4::timestamptz AND k.expires_at > $4::timestamptz);

-- name: purge_lock
-- Locks a live record for KeyPurge. $1 scope, $2 endpoint, $3 key, $4 now.
SELECT {{columns}}
FROM {{schema}}.idem_keys AS k
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3
  AND (k.expires_at > $4::timestamptz OR k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= $4::timestamptz
           AND k.lease_expired_state = 'unknown'))
FOR UPDATE;

-- name: purge
-- Deletes a record KeyPurge locked and checked, and wakes its waiters.
-- $1 scope, $2 endpoint, $3 key.
WITH u AS (
    DELETE FROM {{schema}}.idem_keys AS k
    WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3
    RETURNING k.scope, k.endpoint, k.key, k.waiters
), n AS (
    SELECT pg_notify({{channel}}, {{notify_payload}}) FROM u WHERE u.waiters
)
SELECT (SELECT count(*) FROM u), (SELECT count(*) FROM n);

-- name: reconcile_claim
-- Claims at most $3 unknown records due at $1, holding them until $2, as the
-- outbox relay claims rows: rows another claimer holds are skipped, and a
-- row it claimed and committed meanwhile is re-checked and no longer due.
-- $4, when not null, is the end of the grace: only records whose lease
-- ended by then are claimed.
WITH batch AS (
    SELECT scope, endpoint, key
    FROM {{schema}}.idem_keys
    WHERE unknown_since IS NOT NULL
      AND (reconcile_after IS NULL OR reconcile_after <= $1::timestamptz)
      AND ($4::timestamptz IS NULL OR locked_until <= $4::timestamptz)
    ORDER BY reconcile_after NULLS FIRST, unknown_since
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE {{schema}}.idem_keys AS k SET reconcile_after = $2::timestamptz
FROM batch AS b
WHERE k.scope = b.scope AND k.endpoint = b.endpoint AND k.key = b.key
RETURNING {{columns}};

-- name: reconcile_fail
-- Records a failed reconciliation attempt of an unknown record, fenced on
-- the token. $1 scope, $2 endpoint, $3 key, $4 token, $5 error,
-- $6 reconcile_after.
UPDATE {{schema}}.idem_keys AS k SET
    reconcile_attempts = k.reconcile_attempts + 1,
    reconcile_error = $5::text,
    reconcile_after = $6::timestamptz
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
  AND k.state = 'unknown';

-- name: backlog
-- Counts the unknown records and finds the oldest (idem_keys_reconcile_idx).
SELECT count(*), min(unknown_since)
FROM {{schema}}.idem_keys
WHERE unknown_since IS NOT NULL;
