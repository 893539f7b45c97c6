-- purge.lua deletes a record for an operator and returns it as it was. An
-- unknown record (or an expired lease that turns unknown) or one in
-- progress is deleted only with force.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token ('' for any), ARGV[3] force ('1' or '0'),
-- ARGV[4] index member, ARGV[5] channel
local now = tonumber(ARGV[1])
local r, stored = load(KEYS[1])
if not r or expired(r, now) then
  return redis.error_reply('IDEM_NOT_FOUND')
end
if ARGV[2] ~= '' and not fenced(r, ARGV[2]) then
  return lease_lost()
end
if ARGV[3] ~= '1' and (r.state == 'in_progress' or r.state == 'unknown') then
  return redis.error_reply('IDEM_INVALID_STATE')
end
stored = stored or encode(r)
redis.call('DEL', KEYS[1])
for i = 2, 5 do
  redis.call('ZREM', KEYS[i], ARGV[4])
end
notify(r, ARGV[5])
return stored
