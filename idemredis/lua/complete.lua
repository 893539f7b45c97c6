-- complete.lua stores the response and moves the record to completed when the
-- token matches and the record is in_progress or unknown.
--
-- KEYS: see record_keys.
-- ARGV[1] now, ARGV[2] token, ARGV[3] not_replayable ('1' or '0'),
-- ARGV[4] status, ARGV[5] header, ARGV[6] body, ARGV[7] lease index member,
-- ARGV[8] channel, ARGV[9] the record as the reservation wrote it, or ''
-- when the caller does not know it; with it, ARGV[10] the record this
-- script writes when it finds ARGV[9] (built by the caller as below: the
-- caller checked that ARGV[9] is in_progress with the token, no waiters,
-- its lease and retention running at now), ARGV[11] its Redis TTL in ms,
-- ARGV[12] its expires_at; ARGV[4] to ARGV[6] are then '' and read from
-- ARGV[10].
local now = tonumber(ARGV[1])
local status, header, body = ARGV[4], ARGV[5], ARGV[6]
if ARGV[9] ~= '' then
  local v = redis.pcall('GET', KEYS[1])
  if v == ARGV[9] then
    -- Unchanged since the reservation: the outcome is ARGV[10].
    redis.call('SET', KEYS[1], ARGV[10], 'PX', ARGV[11])
    redis.call('ZREM', KEYS[2], ARGV[7])
    expiry_indexed(KEYS[3], ARGV[7], ARGV[12], now)
    return 1
  end
  local n = decode(ARGV[10])
  status, header, body = n.status, n.header, n.body
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
if ARGV[3] == '1' then
  r.not_replayable, r.status, r.header, r.body = '1', '', '', ''
else
  r.status, r.header, r.body = status, header, body
end
redis.call('ZREM', KEYS[2], ARGV[7])
local ttl = settled(record_keys(), ARGV[7], r, now, was_unknown)
notify(r, ARGV[8])
save(KEYS[1], r, ttl)
return 1
