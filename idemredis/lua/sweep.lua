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
r.state, r.updated_at = r.lease_expired_state, ARGV[1]
redis.call('ZREM', KEYS[2], ARGV[2])
notify(r, ARGV[3])
if r.state == 'unknown' then
  turned_unknown(record_keys(), ARGV[2], r, ARGV[1])
  save(KEYS[1], r, 'none')
else
  expiry_indexed(KEYS[3], ARGV[2], r.expires_at, now)
  save(KEYS[1], r, 'keep')
end
return encode(r)
