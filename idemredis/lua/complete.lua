-- complete.lua stores the response and moves the record to completed when the
-- token matches and the record is in_progress or unknown.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] lease index member, ARGV[4] channel,
-- ARGV[5] '' when the caller does not know the record, then ARGV[6]
-- not_replayable ('1' or '0'), ARGV[7] status, ARGV[8] header, ARGV[9]
-- body. Otherwise ARGV[5] is the proof of the record as the reservation
-- wrote it: its head and token, the start of the stored string (see
-- codec.go); ARGV[6] the proof's last offset (its length less one),
-- ARGV[7] the record this script writes when it finds the proof (built by
-- the caller as below: the caller checked that the reservation's record is
-- in_progress with the token, no waiters, its lease and retention running
-- at now), ARGV[8] its Redis TTL in ms, ARGV[9] its expires_at.
--
-- The proof suffices: every script that changes an in_progress record
-- changes its head (state, times, waiters) or its token, and the variable
-- fields that follow the token (fingerprint, identity, recovery point) are
-- set with a new token only.
local now = tonumber(ARGV[1])
local not_replayable, status, header, body
if ARGV[5] ~= '' then
  if redis.pcall('GETRANGE', KEYS[1], 0, ARGV[6]) == ARGV[5] then
    -- Unchanged since the reservation: the outcome is ARGV[7].
    redis.call('SET', KEYS[1], ARGV[7], 'PX', ARGV[8])
    redis.call('ZREM', KEYS[2], ARGV[3])
    expiry_indexed(KEYS[3], ARGV[3], ARGV[9], now)
    return 1
  end
  local n = decode(ARGV[7])
  not_replayable, status, header, body = n.not_replayable, n.status, n.header, n.body
else
  not_replayable, status, header, body = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
end
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
local was_unknown = is_unknown(r, now)

r.state, r.updated_at = 'completed', ARGV[1]
if not_replayable == '1' then
  r.not_replayable, r.status, r.header, r.body = '1', '', '', ''
else
  r.status, r.header, r.body = status, header, body
end
redis.call('ZREM', KEYS[2], ARGV[3])
local ttl = settled(record_keys(), ARGV[3], r, now, was_unknown)
notify(r, ARGV[4])
save(KEYS[1], r, ttl)
return 1
