package idemsqlite

// The SQL of the store. Parameters are numbered (?1, ?2, ...) so a statement
// can use one twice; times are unix microseconds.

// recordColumns are the columns scanRecord reads, in its order.
const recordColumns = `scope, endpoint, key, fingerprint, state, token, locked_until, started_at,
	lease_expired_state, response_status, response_header, response_body, not_replayable,
	recovery_point, attempts, created_at, updated_at, expires_at`

// identityWhere selects one record by ?1 scope, ?2 endpoint, ?3 key.
const identityWhere = `scope = ?1 AND endpoint = ?2 AND key = ?3`

const (
	// selectKey reads a record as stored, even past its retention.
	selectKey = `SELECT ` + recordColumns + ` FROM idem_keys WHERE ` + identityWhere

	// insertKey creates a new in_progress record, replacing one past its
	// retention. ?4 fingerprint, ?5 token, ?6 locked_until, ?7 now,
	// ?8 lease_expired_state, ?9 expires_at.
	insertKey = `INSERT INTO idem_keys (scope, endpoint, key, fingerprint, state, token, locked_until,
		started_at, lease_expired_state, attempts, created_at, updated_at, expires_at)
	VALUES (?1, ?2, ?3, ?4, 'in_progress', ?5, ?6, ?7, ?8, 1, ?7, ?7, ?9)
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
		expires_at = excluded.expires_at
	WHERE idem_keys.expires_at <= excluded.created_at
	RETURNING ` + recordColumns

	// takeoverKey starts a new attempt on a released record (or one whose
	// expired lease turns released). ?4 token, ?5 locked_until, ?6 now,
	// ?7 lease_expired_state.
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
		not_replayable = 0
	WHERE ` + identityWhere + ` AND state IN ('released', 'in_progress')
	RETURNING ` + recordColumns

	// expireLease turns an expired lease into its lease_expired_state.
	// ?4 now.
	expireLease = `UPDATE idem_keys SET state = lease_expired_state, updated_at = ?4
	WHERE ` + identityWhere + ` AND state = 'in_progress' AND locked_until <= ?4
	RETURNING ` + recordColumns

	// fencedWhere is the condition of every fenced write: ?4 token owns the
	// record and it is within retention at ?5 now.
	fencedWhere = identityWhere + ` AND token = ?4 AND expires_at > ?5`

	// completeKey stores the response. ?6 status, ?7 header JSON, ?8 body,
	// ?9 not_replayable.
	completeKey = `UPDATE idem_keys SET state = 'completed', response_status = ?6,
		response_header = ?7, response_body = ?8, not_replayable = ?9, updated_at = ?5
	WHERE ` + fencedWhere + ` AND state IN ('in_progress', 'unknown')`

	// releaseKey moves the attempt's record to released.
	releaseKey = `UPDATE idem_keys SET state = 'released', updated_at = ?5
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
		response_body = ?8, not_replayable = ?9, updated_at = ?5
	WHERE ` + identityWhere

	// sweepKeys turns at most ?2 expired leases into their
	// lease_expired_state at ?1 now.
	sweepKeys = `UPDATE idem_keys SET state = lease_expired_state, updated_at = ?1
	WHERE rowid IN (
		SELECT rowid FROM idem_keys
		WHERE state = 'in_progress' AND locked_until <= ?1 AND expires_at > ?1
		ORDER BY locked_until
		LIMIT ?2
	)
	RETURNING ` + recordColumns

	// reapKeys deletes at most ?2 records past their retention at ?1 now.
	reapKeys = `DELETE FROM idem_keys
	WHERE rowid IN (
		SELECT rowid FROM idem_keys WHERE expires_at <= ?1 ORDER BY expires_at LIMIT ?2
	)`

	// listKeys is the head of KeyList; ?1 is now, the filters follow.
	listKeys = `SELECT ` + recordColumns + ` FROM idem_keys WHERE expires_at > ?1`

	// effectiveState is a record's state as a reader sees it at ?1 now.
	effectiveState = `(CASE WHEN state = 'in_progress' AND locked_until <= ?1
		THEN lease_expired_state ELSE state END)`
)
