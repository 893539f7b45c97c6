-- mark_unknown.lua moves an in_progress record to unknown when the token
-- matches.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] lease index member, ARGV[4] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' then
  return lease_lost()
end
redis.call('HSET', KEYS[1], 'state', 'unknown', 'updated_at', ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[3])
turned_unknown(record_keys(), ARGV[3], ARGV[1])
notify(ARGV[4])
return 1
