-- renew.lua extends the lease of an in_progress record when the token matches
-- and the lease has not run out (an expired lease is decided: it turned into
-- its lease_expired_state even if nobody has written that down yet).
--
-- KEYS[1] record, KEYS[2] lease index, KEYS[3] expiry index
-- ARGV[1] now, ARGV[2] token, ARGV[3] locked_until, ARGV[4] index member
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or expired(r, now) or not fenced(r, ARGV[2]) then
  return lease_lost()
end
if r.state ~= 'in_progress' or lease_expired(r, now) then
  return lease_lost()
end
r.locked_until, r.updated_at = ARGV[3], ARGV[1]
save(KEYS[1], r, 'keep')
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
if tonumber(ARGV[3]) > tonumber(r.expires_at) then
  -- The lease now outlives the retention: the record may expire in
  -- progress, and KeyReap must find it.
  redis.call('ZADD', KEYS[3], r.expires_at, ARGV[4])
end
return 1
