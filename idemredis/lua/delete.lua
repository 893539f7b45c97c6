-- delete.lua removes an in_progress record when the token matches: the request
-- was rejected before any effect.
--
-- KEYS[1] record, KEYS[2] lease index, KEYS[3] expiry index
-- ARGV[1] now, ARGV[2] token, ARGV[3] index member, ARGV[4] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' then
  return lease_lost()
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[3])
redis.call('ZREM', KEYS[3], ARGV[3])
notify(r, ARGV[4])
return 1
