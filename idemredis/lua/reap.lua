-- reap.lua deletes one expired record and returns 1, or returns 0. It
-- repairs the expiry index on the way: the entry of a record that is gone is
-- removed, that of a record created again is re-scored, that of an unknown
-- record (never reaped; settling it adds it back) is removed.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] index member, ARGV[3] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return 0
end
if tonumber(r.expires_at) >= now then
  redis.call('ZADD', KEYS[3], r.expires_at, ARGV[2])
  return 0
end
if not expired(r, now) then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
notify(r, ARGV[3])
return 1
