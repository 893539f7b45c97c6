-- reconcile_fail.lua records a failed reconciliation attempt of an unknown
-- record when the token matches.
--
-- KEYS: see record_keys.
-- ARGV[1] token, ARGV[2] error, ARGV[3] reconcile_after, ARGV[4] index member
local r = load(KEYS[1])
if not r or r.state ~= 'unknown' or not fenced(r, ARGV[1]) then
  return lease_lost()
end
r.reconcile_attempts = string.format('%d', (tonumber(r.reconcile_attempts) or 0) + 1)
r.reconcile_error, r.reconcile_after = ARGV[2], ARGV[3]
save(KEYS[1], r, 'keep')
redis.call('ZADD', KEYS[5], ARGV[3], ARGV[4])
return 1
