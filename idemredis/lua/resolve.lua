-- resolve.lua settles an unknown record (or an in_progress one whose expired
-- lease turns unknown) to completed or released when the token matches.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] target state,
-- ARGV[4] not_replayable ('1' or '0'), ARGV[5] status, ARGV[6] header,
-- ARGV[7] body, ARGV[8] lease index member, ARGV[9] channel
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) then
  return redis.error_reply('IDEM_NOT_FOUND')
end
if not fenced(r, ARGV[2]) then
  return lease_lost()
end
if not is_unknown(r, now) then
  return redis.error_reply('IDEM_INVALID_STATE')
end

if ARGV[3] == 'released' then
  redis.call('HSET', KEYS[1], 'state', 'released', 'updated_at', ARGV[1])
elseif ARGV[4] == '1' then
  redis.call('HDEL', KEYS[1], 'status', 'header', 'body')
  redis.call('HSET', KEYS[1], 'state', 'completed', 'not_replayable', '1',
    'updated_at', ARGV[1])
else
  redis.call('HSET', KEYS[1], 'state', 'completed', 'status', ARGV[5],
    'header', ARGV[6], 'body', ARGV[7], 'updated_at', ARGV[1])
end
redis.call('ZREM', KEYS[2], ARGV[8])
settled(record_keys(), ARGV[8], r, now, ARGV[1], true)
notify(ARGV[9])
return 1
