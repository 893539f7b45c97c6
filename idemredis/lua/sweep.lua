-- sweep.lua turns one in_progress record whose lease expired into its
-- lease_expired_state and returns it. It repairs the lease index on the way:
-- entries of records that are gone or no longer in_progress are removed, a
-- renewed lease is re-scored. Returns nil when nothing changed.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] index member, ARGV[3] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or r.state ~= 'in_progress' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return false
end
if not lease_expired(r, now) then
  redis.call('ZADD', KEYS[2], r.locked_until, ARGV[2])
  return false
end
redis.call('HSET', KEYS[1], 'state', r.lease_expired_state,
  'updated_at', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[2])
if r.lease_expired_state == 'unknown' then
  turned_unknown(record_keys(), ARGV[2], ARGV[1])
end
notify(ARGV[3])
return redis.call('HGETALL', KEYS[1])
