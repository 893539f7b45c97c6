-- release.lua moves the record to released (from in_progress or unknown) when
-- the token matches. The recovery point is kept.
--
-- KEYS[1] record, KEYS[2] lease index
-- ARGV[1] now, ARGV[2] token, ARGV[3] lease index member, ARGV[4] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
redis.call('HSET', KEYS[1], 'state', 'released', 'updated_at', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[3])
notify(ARGV[4])
return 1
