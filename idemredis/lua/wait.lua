-- wait.lua registers a waiter on an in_progress record whose lease has not
-- run out (a completion, release, ... then publishes on the record's
-- channel, see notify) and returns the record; it returns any other record
-- unchanged, and nil when there is none.
--
-- KEYS[1] record
-- ARGV[1] now
local now = tonumber(ARGV[1])
local r, stored = load(KEYS[1])
if not r then
  return false
end
if r.state ~= 'in_progress' or lease_expired(r, now) or expired(r, now) then
  return stored or encode(r)
end
r.waiters = string.format('%d', (tonumber(r.waiters) or 0) + 1)
save(KEYS[1], r, 'keep')
return encode(r)
