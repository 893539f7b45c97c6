-- name: reseal
-- Replaces the response of a completed, replayable record (encryption key
-- rotation). updated_at stays: what a replay answers does not change.
-- $1 scope, $2 endpoint, $3 key, $4 token, $5 now, $6 status, $7 header,
-- $8 body.
UPDATE {{schema}}.idem_keys AS k SET
    response_status = $6::integer,
    response_header = $7::jsonb,
    response_body = $8::bytea
WHERE k.scope = $1 AND k.endpoint = $2 AND k.key = $3 AND k.token = $4
  AND k.state = 'completed' AND NOT k.not_replayable
  AND k.expires_at > $5::timestamptz;
