-- release.lua moves the record to released (from in_progress or unknown) when
-- the token matches. The recovery point is kept.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] lease index member, ARGV[4] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
local was_unknown = is_unknown(r, now)
r.state, r.updated_at = 'released', ARGV[1]
redis.call('ZREM', KEYS[2], ARGV[3])
local ttl = settled(record_keys(), ARGV[3], r, now, was_unknown)
notify(r, ARGV[4])
save(KEYS[1], r, ttl)
return 1
