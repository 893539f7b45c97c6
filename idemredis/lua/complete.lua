-- complete.lua stores the response and moves the record to completed when the
-- token matches and the record is in_progress or unknown.
--
-- KEYS: see record_keys; only the first three when the caller hopes the
-- record is as its reservation wrote it (it needs the others where the
-- record was unknown, and then answers all_keys_needed).
-- ARGV[1] now, ARGV[2] token, ARGV[3] '' when the caller does not know the
-- record, then ARGV[4] not_replayable ('1' or '0'), ARGV[5] status, ARGV[6]
-- header, ARGV[7] body. Otherwise ARGV[3] is the proof of the record as the
-- reservation wrote it: its head and token, the start of the stored string
-- (see codec.go); ARGV[4] the proof's last offset (its length less one),
-- ARGV[5] the record this script writes when it finds the proof (built by
-- the caller as below: the caller checked that the reservation's record is
-- in_progress with the token, no waiters, its lease and retention running
-- at now), ARGV[6] its Redis TTL in ms, ARGV[7] its expires_at.
--
-- The proof suffices: every script that changes an in_progress record
-- changes its head (state, times, waiters) or its token, and the variable
-- fields that follow the token (fingerprint, identity, recovery point) are
-- set with a new token only.
local member = member_of(KEYS[1])
local not_replayable, status, header, body
if ARGV[3] ~= '' then
  if redis.pcall('GETRANGE', KEYS[1], 0, ARGV[4]) == ARGV[3] then
    -- Unchanged since the reservation: the outcome is ARGV[5].
    redis.call('SET', KEYS[1], ARGV[5], 'PX', ARGV[6])
    redis.call('ZREM', KEYS[2], member)
    expiry_indexed(KEYS[3], member, ARGV[7], ARGV[1])
    return 1
  end
  local n = decode(ARGV[5])
  not_replayable, status, header, body = n.not_replayable, n.status, n.header, n.body
else
  not_replayable, status, header, body = ARGV[4], ARGV[5], ARGV[6], ARGV[7]
end
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' and r.state ~= 'unknown' then
  return lease_lost()
end
local was_unknown = is_unknown(r, now)
if was_unknown and #KEYS < 5 then
  return all_keys_needed()
end

r.state, r.updated_at = 'completed', ARGV[1]
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
