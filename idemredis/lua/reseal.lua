-- reseal.lua replaces the response of a completed, replayable record when the
-- token matches (encryption key rotation). updated_at stays: what a replay
-- answers does not change.
--
-- KEYS[1] record
-- ARGV[1] now, ARGV[2] token, ARGV[3] status, ARGV[4] header, ARGV[5] body
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'completed' or r.not_replayable == '1' or r.status == '' then
  return redis.error_reply('IDEM_INVALID_STATE')
end
r.status, r.header, r.body = ARGV[3], ARGV[4], ARGV[5]
save(KEYS[1], r, 'keep')
return 1
