-- Statements of the MySQL store, for MySQL 8 and MariaDB 10.6+. Each starts
-- with a "-- name: X" line. Parameters are named (:now, :scope, ...) and
-- bound by name (see compile in queries.go); {{ids}} is the condition that
-- selects the records of a list of identities, :ids; {{columns}} is the record's column
-- list as recordScan reads it, {{id}} the condition that selects the record
-- of :scope, :endpoint and :key, and {{live}} the condition that it is live
-- at :now (within retention, or unknown, which never expires). Time is
-- always a parameter from the store's clock, never the server's NOW().
--
-- Some statements are several, sent in one round trip (the connections run
-- with multiStatements): MySQL has no RETURNING on UPDATE (MariaDB has it on
-- INSERT and DELETE only), so a write that must answer with the record is
-- followed by the SELECT that reads it. Every connection runs at READ
-- COMMITTED (see NewConnector): each statement reads the latest committed
-- rows, a plain read takes no lock, and no statement takes gap locks.
--
-- MySQL runs the assignments of an UPDATE from left to right, each seeing
-- the ones before it: an assignment that reads a column comes before that
-- column's own.

-- name: reserve
-- The common path, one round trip: the INSERT adds a new record only when
-- no row has the identity (NOT EXISTS is a consistent read at READ
-- COMMITTED: it neither locks nor writes), and the SELECT reads the record,
-- new or found. So a replay is two index lookups that write nothing, and a
-- new key one lookup and an insert. Two new keys racing: the second insert
-- waits for the first to commit and then finds the duplicate, which ON
-- DUPLICATE KEY UPDATE leaves as it is. A record this finds but "reclaim"
-- would write (past its retention, released with the same fingerprint, an
-- expired lease) is returned unwritten: KeyReserve then runs "reclaim" (a
-- rare path). The caller holds the lease when the record carries its token.
INSERT INTO idem_keys (scope, endpoint, idem_key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, attempts, created_at,
    updated_at, expires_at, ttl)
SELECT :scope, :endpoint, :key, :fingerprint, 'in_progress', :token,
    :locked_until, :now, :les, 1, :now, :now, :expires_at, :ttl
FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM idem_keys AS k WHERE {{id}})
ON DUPLICATE KEY UPDATE scope = idem_keys.scope;
SELECT {{columns}} FROM idem_keys AS k WHERE {{id}};

-- name: reclaim
-- The whole reservation, run when "reserve" found a record it would write;
-- one round trip. The INSERT is reserve's (the record may have gone since).
-- The first UPDATE takes over a record past its retention (as new), a
-- released one with the same fingerprint, or an expired lease that turns
-- released; the second turns any other expired lease into its
-- lease_expired_state. Their conditions exclude each other on the row as
-- found, and after either has written the other's no longer holds. An
-- UPDATE reads the latest committed row and locks it, so of concurrent
-- reclaims one takes the record and the others find it taken. "Past its
-- retention" is an expired record: never an unknown one, nor an expired
-- lease that turns unknown.
INSERT INTO idem_keys (scope, endpoint, idem_key, fingerprint, state, token,
    locked_until, started_at, lease_expired_state, attempts, created_at,
    updated_at, expires_at, ttl)
SELECT :scope, :endpoint, :key, :fingerprint, 'in_progress', :token,
    :locked_until, :now, :les, 1, :now, :now, :expires_at, :ttl
FROM DUAL
WHERE NOT EXISTS (SELECT 1 FROM idem_keys AS k WHERE {{id}})
ON DUPLICATE KEY UPDATE scope = idem_keys.scope;
UPDATE idem_keys AS k SET
    k.lease_expired_state = CASE WHEN k.expires_at <= :now
        THEN :les ELSE k.lease_expired_state END,
    k.recovery_point = CASE WHEN k.expires_at <= :now
        THEN '' ELSE k.recovery_point END,
    k.attempts = CASE WHEN k.expires_at <= :now
        THEN 1 ELSE k.attempts + 1 END,
    k.created_at = CASE WHEN k.expires_at <= :now
        THEN :now ELSE k.created_at END,
    k.ttl = CASE WHEN k.expires_at <= :now
        THEN :ttl ELSE k.ttl END,
    k.expires_at = CASE WHEN k.expires_at <= :now
        THEN :expires_at ELSE k.expires_at END,
    k.fingerprint = :fingerprint,
    k.state = 'in_progress',
    k.token = :token,
    k.locked_until = :locked_until,
    k.started_at = :now,
    k.response_status = NULL,
    k.response_header = NULL,
    k.response_body = NULL,
    k.not_replayable = FALSE,
    k.updated_at = :now,
    k.reconcile_after = NULL,
    k.reconcile_attempts = 0,
    k.reconcile_error = ''
WHERE {{id}}
  AND ((k.expires_at <= :now AND k.state <> 'unknown'
        AND NOT (k.state = 'in_progress' AND k.locked_until <= :now
                 AND k.lease_expired_state = 'unknown'))
       OR (k.fingerprint = :fingerprint
           AND (k.state = 'released'
                OR (k.state = 'in_progress' AND k.locked_until <= :now
                    AND k.lease_expired_state = 'released'))));
UPDATE idem_keys AS k SET
    k.state = k.lease_expired_state,
    k.updated_at = :now
WHERE {{id}}
  AND k.state = 'in_progress' AND k.locked_until <= :now
  AND (k.expires_at > :now OR k.lease_expired_state = 'unknown')
  AND NOT (k.fingerprint = :fingerprint AND k.lease_expired_state = 'released');
SELECT {{columns}} FROM idem_keys AS k WHERE {{id}};

-- name: get
SELECT {{columns}} FROM idem_keys AS k WHERE {{id}} AND {{live}};

-- name: complete
-- A late completion of an unknown record (or of an in-progress one whose
-- expired lease turns unknown) settles it: its retention starts again.
UPDATE idem_keys AS k SET
    k.expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= :now
               AND k.lease_expired_state = 'unknown'))
        THEN DATE_ADD(:now, INTERVAL k.ttl MICROSECOND) ELSE k.expires_at END,
    k.state = 'completed',
    k.response_status = :status,
    k.response_header = :header,
    k.response_body = :body,
    k.not_replayable = :not_replayable,
    k.updated_at = :now
WHERE {{id}} AND k.token = :token
  AND k.state IN ('in_progress', 'unknown') AND {{live}};

-- name: release
UPDATE idem_keys AS k SET
    k.expires_at = CASE WHEN (k.state = 'unknown'
           OR (k.state = 'in_progress' AND k.locked_until <= :now
               AND k.lease_expired_state = 'unknown'))
        THEN DATE_ADD(:now, INTERVAL k.ttl MICROSECOND) ELSE k.expires_at END,
    k.state = 'released',
    k.updated_at = :now
WHERE {{id}} AND k.token = :token
  AND k.state IN ('in_progress', 'unknown') AND {{live}};

-- name: mark_unknown
UPDATE idem_keys AS k SET
    k.state = 'unknown',
    k.updated_at = :now
WHERE {{id}} AND k.token = :token AND k.state = 'in_progress' AND {{live}};

-- name: delete
DELETE k FROM idem_keys AS k
WHERE {{id}} AND k.token = :token AND k.state = 'in_progress' AND {{live}};

-- name: renew
UPDATE idem_keys AS k SET
    k.locked_until = :locked_until,
    k.updated_at = :now
WHERE {{id}} AND k.token = :token AND k.state = 'in_progress'
  AND k.expires_at > :now;

-- name: checkpoint
UPDATE idem_keys AS k SET
    k.recovery_point = :recovery_point,
    k.updated_at = :now
WHERE {{id}} AND k.token = :token AND k.state = 'in_progress'
  AND k.expires_at > :now;

-- name: resolve
-- An unknown record, or an in-progress one whose expired lease turns
-- unknown, settles to completed or released; its retention starts again.
UPDATE idem_keys AS k SET
    k.state = :state,
    k.response_status = :status,
    k.response_header = :header,
    k.response_body = :body,
    k.not_replayable = :not_replayable,
    k.updated_at = :now,
    k.expires_at = DATE_ADD(:now, INTERVAL k.ttl MICROSECOND)
WHERE {{id}} AND k.token = :token
  AND (k.state = 'unknown'
       OR (k.state = 'in_progress' AND k.locked_until <= :now
           AND k.lease_expired_state = 'unknown'));

-- name: reseal
-- Replaces the response of a completed, replayable record (encryption key
-- rotation). updated_at stays: what a replay answers does not change.
UPDATE idem_keys AS k SET
    k.response_status = :status,
    k.response_header = :header,
    k.response_body = :body
WHERE {{id}} AND k.token = :token
  AND k.state = 'completed' AND NOT k.not_replayable
  AND k.expires_at > :now;

-- name: sweep_lock
-- Locks at most :limit expired leases for KeySweep, skipping rows another
-- transaction holds (idem_keys_sweep_idx).
SELECT k.scope, k.endpoint, k.idem_key
FROM idem_keys AS k
WHERE k.state = 'in_progress' AND k.locked_until <= :now
ORDER BY k.locked_until
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: sweep
-- Turns the expired leases sweep_lock locked ({{ids}}) into their
-- lease_expired_state and reads them.
UPDATE idem_keys AS k SET
    k.state = k.lease_expired_state,
    k.updated_at = :now
WHERE {{ids}};
SELECT {{columns}} FROM idem_keys AS k WHERE {{ids}};

-- name: reap_done
-- Locks at most :limit settled records past their retention
-- (idem_keys_reap_idx), skipping rows another transaction holds.
SELECT k.scope, k.endpoint, k.idem_key
FROM idem_keys AS k
WHERE k.state IN ('completed', 'released') AND k.expires_at <= :now
ORDER BY k.expires_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: reap_live
-- Locks at most :limit in-progress records past their retention (a lease
-- renewed beyond it), never an expired lease that turns unknown
-- (idem_keys_sweep_idx).
SELECT k.scope, k.endpoint, k.idem_key
FROM idem_keys AS k
WHERE k.state = 'in_progress' AND k.expires_at <= :now
  AND NOT (k.locked_until <= :now AND k.lease_expired_state = 'unknown')
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: reap
-- Deletes the records reap_done and reap_live locked ({{ids}}).
DELETE k FROM idem_keys AS k WHERE {{ids}};

-- name: list
-- The head of KeyList, which adds its filters, the keyset cursor, the order
-- by the primary key and the limit.
SELECT {{columns}} FROM idem_keys AS k WHERE {{live}};

-- name: purge_lock
-- Locks a live record for KeyPurge.
SELECT {{columns}} FROM idem_keys AS k WHERE {{id}} AND {{live}} FOR UPDATE;

-- name: purge
-- Deletes a record KeyPurge locked and checked.
DELETE k FROM idem_keys AS k WHERE {{id}};

-- name: reconcile_lock
-- Locks at most :limit unknown records due at :now for KeyReconcileClaim,
-- earliest first (NULL, never claimed, sorts first), skipping rows another
-- claimer holds (idem_keys_reconcile_idx). A record whose lease ended after
-- :grace_end (now less the grace) is not due yet.
SELECT k.scope, k.endpoint, k.idem_key
FROM idem_keys AS k
WHERE k.state = 'unknown'
  AND (k.reconcile_after IS NULL OR k.reconcile_after <= :now)
  AND k.locked_until <= :grace_end
ORDER BY k.reconcile_after, k.updated_at
LIMIT :limit
FOR UPDATE SKIP LOCKED;

-- name: reconcile_claim
-- Holds the records reconcile_lock locked ({{ids}}) until :hold and reads
-- them.
UPDATE idem_keys AS k SET k.reconcile_after = :hold WHERE {{ids}};
SELECT {{columns}} FROM idem_keys AS k WHERE {{ids}};

-- name: reconcile_fail
-- Records a failed reconciliation attempt of an unknown record, fenced on
-- the token.
UPDATE idem_keys AS k SET
    k.reconcile_attempts = k.reconcile_attempts + 1,
    k.reconcile_error = :error,
    k.reconcile_after = :reconcile_after
WHERE {{id}} AND k.token = :token AND k.state = 'unknown';

-- name: backlog
-- Counts the unknown records and finds the oldest (idem_keys_reconcile_idx).
SELECT count(*), min(k.updated_at) FROM idem_keys AS k WHERE k.state = 'unknown';
