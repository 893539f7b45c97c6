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

if ARGV[3] == '1' then
  redis.call('HDEL', KEYS[1], 'status', 'header', 'body')
  redis.call('HSET', KEYS[1], 'state', 'completed', 'not_replayable', '1',
    'updated_at', ARGV[1])
else
  redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[4],
    'header', ARGV[5], 'body', ARGV[6], 'updated_at', ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[7])
settled(record_keys(), ARGV[7], r, now, ARGV[1], was_unknown)
notify(ARGV[8])
return 1
