-- reconcile_claim.lua claims one unknown record due for reconciliation: it
-- sets reconcile_after to the end of the hold and returns the record. It
-- repairs the reconcile index on the way: the entry of a record that is gone
-- or no longer unknown is removed, one not yet due is re-scored. A record
-- whose lease ended less than the grace ago is not claimed either: its entry
-- is scored at the grace's end, when the next claim may take it. Returns nil
-- when it claimed nothing.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] hold until, ARGV[3] index member, ARGV[4] grace
-- (microseconds; 0 for none)
local now = tonumber(ARGV[1])
local r = load(KEYS[1])
if not r or r.state ~= 'unknown' then
  redis.call('ZREM', KEYS[5], ARGV[3])
  return false
end
local after = r.reconcile_after
if tonumber(after) > now then
  redis.call('ZADD', KEYS[5], after, ARGV[3])
  return false
end
local grace = tonumber(ARGV[4])
if grace > 0 and tonumber(r.locked_until) + grace > now then
  redis.call('ZADD', KEYS[5], string.format('%d', tonumber(r.locked_until) + grace), ARGV[3])
  return false
end
r.reconcile_after = ARGV[2]
save(KEYS[1], r, 'keep')
redis.call('ZADD', KEYS[5], ARGV[2], ARGV[3])
return encode(r)
