-- complete.lua stores the response and moves the record to completed when the
-- token matches and the record is in_progress or unknown.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] not_replayable ('1' or '0'),
-- ARGV[4] status, ARGV[5] header, ARGV[6] body, ARGV[7] lease index member,
-- ARGV[8] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
local was_unknown = is_unknown(r, now)

r.state, r.updated_at = 'completed', ARGV[1]
if ARGV[3] == '1' then
  r.not_replayable, r.status, r.header, r.body = '1', '', '', ''
else
  r.status, r.header, r.body = ARGV[4], ARGV[5], ARGV[6]
end
redis.call('ZREM', KEYS[2], ARGV[7])
local ttl = settled(record_keys(), ARGV[7], r, now, was_unknown)
notify(r, ARGV[8])
save(KEYS[1], r, ttl)
return 1
