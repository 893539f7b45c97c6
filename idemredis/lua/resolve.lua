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

r.updated_at = ARGV[1]
if ARGV[3] == 'released' then
  r.state = 'released'
elseif ARGV[4] == '1' then
  r.state, r.not_replayable, r.status, r.header, r.body = 'completed', '1', '', '', ''
else
  r.state, r.status, r.header, r.body = 'completed', ARGV[5], ARGV[6], ARGV[7]
end
redis.call('ZREM', KEYS[2], ARGV[8])
local ttl = settled(record_keys(), ARGV[8], r, now, true)
notify(r, ARGV[9])
save(KEYS[1], r, ttl)
return 1
