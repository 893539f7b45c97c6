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
r.state, r.updated_at = 'unknown', ARGV[1]
redis.call('ZREM', KEYS[2], ARGV[3])
turned_unknown(record_keys(), ARGV[3], r, ARGV[1])
notify(r, ARGV[4])
save(KEYS[1], r, 'none')
return 1
