-- reserve.lua inserts a new in_progress record, or takes over a released one
-- (or an expired lease that turns released), and otherwise returns the
-- existing record, applying a lease expiry it finds. One round trip; a replay
-- (completed record) writes nothing.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] scope, ARGV[3] endpoint, ARGV[4] key,
-- ARGV[5] fingerprint, ARGV[6] token, ARGV[7] locked_until,
-- ARGV[8] lease_expired_state, ARGV[9] expires_at, ARGV[10] Redis TTL in ms,
-- ARGV[11] index member, ARGV[12] channel, ARGV[13] prune horizon,
-- ARGV[14] ttl (retention in microseconds)
-- Returns {1} for a new record (made of the arguments alone), otherwise
-- {reserved (0 or 1), field, value, ...}.
local now = tonumber(ARGV[1])
local k = record_keys()
local r = load(KEYS[1])

if r and expired(r, now) then
  -- Gone: replaced below (the expiry index entry is re-scored there).
  redis.call('DEL', KEYS[1])
  redis.call('ZREM', KEYS[2], ARGV[11])
  r = nil
end

if not r then
  redis.call('HSET', KEYS[1],
    'scope', ARGV[2], 'endpoint', ARGV[3], 'key', ARGV[4],
    'fingerprint', ARGV[5], 'state', 'in_progress', 'token', ARGV[6],
    'locked_until', ARGV[7], 'started_at', ARGV[1],
    'lease_expired_state', ARGV[8], 'attempts', '1',
    'created_at', ARGV[1], 'updated_at', ARGV[1], 'expires_at', ARGV[9],
    'ttl', ARGV[14])
  -- A lease that expires into unknown must never be removed by Redis's TTL:
  -- the TTL is set when the record is settled (see settled).
  if ARGV[8] == 'released' then
    redis.call('PEXPIRE', KEYS[1], ARGV[10])
  end
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[11])
  -- Entries of records Redis removed by TTL long ago, when nobody runs
  -- KeyReap, would stay in the expiry index: drop a few per new record.
  local stale = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[13],
    'LIMIT', 0, 4)
  for _, m in ipairs(stale) do
    redis.call('ZREM', KEYS[3], m)
  end
  redis.call('ZADD', KEYS[3], ARGV[9], ARGV[11])
  -- The record is exactly what the arguments say: the caller builds it.
  return {1}
end

if lease_expired(r, now) then
  -- Decided on this request; it does not wait for the sweeper.
  r.state = r.lease_expired_state
  redis.call('HSET', KEYS[1], 'state', r.state, 'updated_at', ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[11])
  if r.state == 'unknown' then
    turned_unknown(k, ARGV[11], ARGV[1])
  end
  notify(ARGV[12])
end

if r.state == 'released' and r.fingerprint == ARGV[5] then
  -- Take over: a new attempt with a new fencing token. Retention, creation
  -- time and the recovery point are kept; the reconciliation state starts
  -- afresh.
  redis.call('HDEL', KEYS[1], 'status', 'header', 'body', 'not_replayable',
    'reconcile_after', 'reconcile_attempts', 'reconcile_error')
  redis.call('HSET', KEYS[1],
    'state', 'in_progress', 'token', ARGV[6], 'locked_until', ARGV[7],
    'started_at', ARGV[1], 'lease_expired_state', ARGV[8],
    'updated_at', ARGV[1])
  redis.call('HINCRBY', KEYS[1], 'attempts', 1)
  if ARGV[8] ~= 'released' then
    redis.call('PERSIST', KEYS[1])
  end
  redis.call('ZADD', KEYS[2], ARGV[7], ARGV[11])
  return {1, unpack(redis.call('HGETALL', KEYS[1]))}
end

return {0, unpack(redis.call('HGETALL', KEYS[1]))}
