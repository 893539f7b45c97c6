-- complete.lua stores the response and moves the record to completed when the
-- token matches and the record is in_progress or unknown.
--
-- KEYS: see record_keys; only the first three when the caller hopes the
-- record is as its reservation wrote it (it needs the others where the
-- record was unknown, and then answers all_keys_needed).
-- When the caller knows the record its reservation wrote, five arguments:
-- ARGV[1] the proof of that record: its head and token, the start of the
-- stored string (see codec.go); ARGV[2] the proof's last offset (its
-- length less one), ARGV[3] the record this script writes when it finds
-- the proof (built by the caller as below: the caller checked that the
-- reservation's record is in_progress with the token, no waiters, its
-- lease and retention running at now), ARGV[4] its Redis TTL in ms,
-- ARGV[5] its expires_at. The token is the proof's end, now the new
-- record's updated_at. Otherwise six: ARGV[1] now, ARGV[2] token, ARGV[3]
-- not_replayable ('1' or '0'), ARGV[4] status, ARGV[5] header, ARGV[6]
-- body.
--
-- The proof suffices: every script that changes an in_progress record
-- changes its head (state, times, waiters) or its token, and the variable
-- fields that follow the token (fingerprint, identity, recovery point) are
-- set with a new token only.
local member = member_of(KEYS[1])
local now_arg, token, not_replayable, status, header, body
if #ARGV == 5 then
  if redis.pcall('GETRANGE', KEYS[1], 0, ARGV[2]) == ARGV[1] then
    -- Unchanged since the reservation: the outcome is ARGV[3].
    redis.call('SET', KEYS[1], ARGV[3], 'PX', ARGV[4])
    redis.call('ZREM', KEYS[2], member)
    expiry_indexed(KEYS[3], member, ARGV[5], prunes(member) and string.match(ARGV[3], UPDATED_AT))
    return 1
  end
  local n = decode(ARGV[3])
  -- The head has no ';': the token is all after the first.
  now_arg, token = n.updated_at, string.match(ARGV[1], ';(.*)$')
  not_replayable, status, header, body = n.not_replayable, n.status, n.header, n.body
else
  now_arg, token = ARGV[1], ARGV[2]
  not_replayable, status, header, body = ARGV[3], ARGV[4], ARGV[5], ARGV[6]
end
local now = tonumber(now_arg)
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, token) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
local was_unknown = is_unknown(r, now)
if was_unknown and #KEYS < 5 then
  return all_keys_needed()
end

r.state, r.updated_at = 'completed', now_arg
if not_replayable == '1' then
  r.not_replayable, r.status, r.header, r.body = '1', '', '', ''
else
  r.status, r.header, r.body = status, header, body
end
redis.call('ZREM', KEYS[2], member)
local ttl = settled(record_keys(), member, r, now, was_unknown)
notify(r)
save(KEYS[1], r, ttl)
return 1
