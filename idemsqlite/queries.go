package idemsqlite

// The SQL of the store. Parameters are numbered (?1, ?2, ...) so a statement
// can use one twice; times are unix microseconds.

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `scope, endpoint, key, fingerprint, state, token, locked_until, started_at,
	lease_expired_state, response_status, response_header, response_body, not_replayable,
	recovery_point, attempts, created_at, updated_at, expires_at, ttl, reconcile_after,
	reconcile_attempts, reconcile_error`

// identityWhere selects one record by ?1 scope, ?2 endpoint, ?3 key.
const identityWhere = `scope = ?1 AND endpoint = ?2 AND key = ?3`

const (
	// selectKey reads a record as stored, even past its retention.
	selectKey = `SELECT ` + recordColumns + ` FROM idem_keys WHERE ` + identityWhere

	// insertKey creates a new in_progress record, replacing an expired one;
	// it changes no row when the key holds a live record. ?4 fingerprint,
	// ?5 token, ?6 locked_until, ?7 now, ?8 lease_expired_state,
	// ?9 expires_at, ?10 ttl.
	insertKey = `INSERT INTO idem_keys (scope, endpoint, key, fingerprint, state, token, locked_until,
		started_at, lease_expired_state, attempts, created_at, updated_at, expires_at, ttl)
	VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, ?7, ?8, 1, ?7, ?7, ?9, ?10)
	ON CONFLICT (scope, endpoint, key) DO UPDATE SET
		fingerprint = excluded.fingerprint,
		state = excluded.state,
		token = excluded.token,
		locked_until = excluded.locked_until,
		started_at = excluded.started_at,
		lease_expired_state = excluded.lease_expired_state,
		response_status = NULL,
		response_header = NULL,
		response_body = NULL,
		not_replayable = 0,
		recovery_point = '',
		attempts = 1,
		created_at = excluded.created_at,
		updated_at = excluded.updated_at,
		expires_at = excluded.expires_at,
		ttl = excluded.ttl,
		reconcile_after = 0,
		reconcile_attempts = 0,
		reconcile_error = ''
	WHERE idem_keys.expires_at <= excluded.created_at AND idem_keys.state <> 'unknown'
		AND NOT (idem_keys.state = 'in_progress' AND idem_keys.locked_until <= excluded.created_at
			AND idem_keys.lease_expired_state = 'unknown')`

	// takeoverKey starts a new attempt on a released record (or one whose
	// expired lease turns released, which KeyReserve checked). ?4 token,
	// ?5 locked_until, ?6 now, ?7 lease_expired_state.
	takeoverKey = `UPDATE idem_keys SET
		state = 'in_progress',
		token = ?4,
		locked_until = ?5,
		started_at = ?6,
		updated_at = ?6,
		lease_expired_state = ?7,
		attempts = attempts + 1,
		response_status = NULL,
		response_header = NULL,
		response_body = NULL,
		not_replayable = 0,
		reconcile_after = 0,
		reconcile_attempts = 0,
		reconcile_error = ''
	WHERE ` + identityWhere + ` AND state IN ('released', 'in_progress')
	RETURNING ` + recordColumns

	// expireLease turns an expired lease into its lease_expired_state.
	// ?4 now.
	expireLease = `UPDATE idem_keys SET state = lease_expired_state, updated_at = ?4
	WHERE ` + identityWhere + ` AND state = 'in_progress' AND locked_until <= ?4
	RETURNING ` + recordColumns

	// fencedWhere is the condition of every fenced write: ?4 token owns the
	// record and it is live at ?5 now.
	fencedWhere = identityWhere + ` AND token = ?4 AND ` + liveAt5

	// liveAt5 holds for a record that is not expired at ?5 now: within
	// retention, or unknown (stored so, or an expired lease that turns
	// unknown), which never expires.
	liveAt5 = `(expires_at > ?5 OR ` + unknownAt5 + `)`

	// unknownAt5 holds for a record that is unknown at ?5 now.
	unknownAt5 = `(state = 'unknown' OR (state = 'in_progress' AND locked_until <= ?5
		AND lease_expired_state = 'unknown'))`

	// settledExpiresAt is the expires_at of a record being settled at ?5:
	// an unknown one starts its retention again.
	settledExpiresAt = `expires_at = CASE WHEN ` + unknownAt5 + ` THEN ?5 + ttl ELSE expires_at END`

	// completeKey stores the response. ?6 status, ?7 header JSON, ?8 body,
	// ?9 not_replayable.
	completeKey = `UPDATE idem_keys SET state = 'completed', response_status = ?6,
		response_header = ?7, response_body = ?8, not_replayable = ?9, updated_at = ?5,
		` + settledExpiresAt + `
	WHERE ` + fencedWhere + ` AND state IN ('in_progress', 'unknown')`

	// releaseKey moves the attempt's record to released.
	releaseKey = `UPDATE idem_keys SET state = 'released', updated_at = ?5, ` + settledExpiresAt + `
	WHERE ` + fencedWhere + ` AND state IN ('in_progress', 'unknown')`

	// markUnknownKey moves the attempt's record to unknown.
	markUnknownKey = `UPDATE idem_keys SET state = 'unknown', updated_at = ?5
	WHERE ` + fencedWhere + ` AND state = 'in_progress'`

	// deleteKey drops the attempt's record.
	deleteKey = `DELETE FROM idem_keys WHERE ` + fencedWhere + ` AND state = 'in_progress'`

	// renewKey extends the lease. ?6 locked_until.
	renewKey = `UPDATE idem_keys SET locked_until = ?6, updated_at = ?5
	WHERE ` + fencedWhere + ` AND state = 'in_progress'`

	// checkpointKey records ?6 as the attempt's last committed phase.
	checkpointKey = `UPDATE idem_keys SET recovery_point = ?6, updated_at = ?5
	WHERE ` + fencedWhere + ` AND state = 'in_progress'`

	// resolveKey settles an unknown record, read in the same transaction.
	// ?4 state, ?5 now, ?6 status, ?7 header JSON, ?8 body, ?9 not_replayable.
	resolveKey = `UPDATE idem_keys SET state = ?4, response_status = ?6, response_header = ?7,
		response_body = ?8, not_replayable = ?9, updated_at = ?5, expires_at = ?5 + ttl
	WHERE ` + identityWhere

	// sweepKeys turns at most ?2 expired leases into their
	// lease_expired_state at ?1 now.
	sweepKeys = `UPDATE idem_keys SET state = lease_expired_state, updated_at = ?1
	WHERE rowid IN (
		SELECT rowid FROM idem_keys
		WHERE state = 'in_progress' AND locked_until <= ?1
			AND (expires_at > ?1 OR lease_expired_state = 'unknown')
		ORDER BY locked_until
		LIMIT ?2
	)
	RETURNING ` + recordColumns

	// reapKeys deletes at most ?2 expired records at ?1 now: past their
	// retention and not unknown. Each branch reads its partial index
	// (idem_keys_reap_idx, idem_keys_sweep_idx) and stops at the limit.
	reapKeys = `DELETE FROM idem_keys
	WHERE rowid IN (
		SELECT rowid FROM (
			SELECT rowid, expires_at FROM idem_keys
			WHERE state IN ('completed', 'released') AND expires_at <= ?1
			UNION ALL
			SELECT rowid, expires_at FROM idem_keys
			WHERE state = 'in_progress' AND expires_at <= ?1
				AND NOT (locked_until <= ?1 AND lease_expired_state = 'unknown')
		)
		LIMIT ?2
	)`

	// listKeys is the head of KeyList; ?1 is now, the filters follow.
	listKeys = `SELECT ` + recordColumns + ` FROM idem_keys WHERE (expires_at > ?1 OR state = 'unknown'
		OR (state = 'in_progress' AND locked_until <= ?1 AND lease_expired_state = 'unknown'))`

	// purgeKey deletes a record for an operator (KeyPurge checks it first,
	// in the same transaction).
	purgeKey = `DELETE FROM idem_keys WHERE ` + identityWhere

	// claimKeys claims at most ?3 due unknown records at ?1 now, holding
	// them until ?2; with a positive ?4 grace (microseconds) only those
	// whose lease ended at least that long ago.
	claimKeys = `UPDATE idem_keys SET reconcile_after = ?2
	WHERE rowid IN (
		SELECT rowid FROM idem_keys
		WHERE state = 'unknown' AND reconcile_after <= ?1
			AND (?4 <= 0 OR locked_until <= ?1 - ?4)
		ORDER BY reconcile_after, updated_at
		LIMIT ?3
	)
	RETURNING ` + recordColumns

	// failReconcileKey records a failed reconciliation attempt. ?6 error,
	// ?7 reconcile_after.
	failReconcileKey = `UPDATE idem_keys SET reconcile_attempts = reconcile_attempts + 1,
		reconcile_error = ?6, reconcile_after = ?7
	WHERE ` + fencedWhere + ` AND state = 'unknown'`

	// backlogKeys counts the unknown records and finds the oldest.
	backlogKeys = `SELECT count(*), coalesce(min(updated_at), 0) FROM idem_keys WHERE state = 'unknown'`

	// effectiveState is a record's state as a reader sees it at ?1 now.
	effectiveState = `(CASE WHEN state = 'in_progress' AND locked_until <= ?1
		THEN lease_expired_state ELSE state END)`
)
