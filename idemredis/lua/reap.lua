-- reap.lua deletes one record past its retention and returns 1, or returns 0.
-- It repairs the expiry index on the way: the entry of a record that is gone
-- is removed, that of a record created again is re-scored.
--
-- KEYS[1] record, KEYS[2] lease index, KEYS[3] expiry index
-- ARGV[1] now, ARGV[2] index member, ARGV[3] channel
local now = tonumber(ARGV[1])
local expires_at = redis.call('HGET', KEYS[1], 'expires_at')
if not expires_at then
  redis.call('ZREM', KEYS[3], ARGV[2])
  return 0
end
if tonumber(expires_at) >= now then
  redis.call('ZADD', KEYS[3], expires_at, ARGV[2])
  return 0
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
notify(ARGV[3])
return 1
