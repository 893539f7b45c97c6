-- reserve.lua inserts a new in_progress record, or takes over a released one
-- (or an expired lease that turns released), and otherwise returns the
-- existing record, applying a lease expiry it finds. One round trip; a replay
-- (completed record) writes nothing.
--
-- KEYS: see record_keys; only the first two when the caller hopes for a
-- new key or a replay (the script needs the others where it finds a lease
-- that ran out, and then answers all_keys_needed) and ARGV[5] is absent.
-- ARGV[1] now, ARGV[2] the new record (in_progress, its times from now),
-- ARGV[3] its locked_until, ARGV[4] Redis TTL in ms (0 or absent for none:
-- a lease that expires into unknown), ARGV[5] its expires_at when the
-- expiry index must list it from the start (it may expire in progress: its
-- lease turns released or outlives its retention), otherwise 0 or absent.
-- (Each argument costs the server its parsing and its hashing into Lua,
-- and a fourth one a resize of the ARGV table.)
-- Returns 1 for a new record (the one of the arguments), the record for one
-- not reserved (a replay: the string as stored, not decoded), or
-- {1, record} for a record taken over.
local ttl_ms, expiry_score = ARGV[4] or '0', ARGV[5] or '0'
-- A new key first: SET NX inserts the record where there is none, and GET
-- returns what there was (nil for nothing: done but for the indexes).
local got
if ttl_ms == '0' then
  got = redis.pcall('SET', KEYS[1], ARGV[2], 'NX', 'GET')
else
  got = redis.pcall('SET', KEYS[1], ARGV[2], 'PX', ttl_ms, 'NX', 'GET')
end
if not got then
  local member = member_of(KEYS[1])
  if expiry_score ~= '0' then
    expiry_indexed(KEYS[3], member, expiry_score, ARGV[1])
  end
  redis.call('ZADD', KEYS[2], ARGV[3], member)
  return 1
end
if type(got) == 'table' and not string.find(got.err or '', '^WRONGTYPE') then
  -- Before Redis 7, NX and GET do not go together (a syntax error); or
  -- the server refuses a write (above maxmemory, a replay must still be
  -- answered): read, then write below.
  got = redis.pcall('GET', KEYS[1])
end
local now = tonumber(ARGV[1])
if type(got) == 'string' then
  -- A replay, the common case of a key seen before: one match decides it.
  local expires_at = string.match(got, DONE)
  if expires_at and tonumber(expires_at) >= now then
    return got
  end
end
local member = member_of(KEYS[1])
local r, stored = load(KEYS[1], true, got)
if r and #KEYS < 5 and lease_expired(r, now) then
  return all_keys_needed()
end

if r and expired(r, now) then
  -- Gone: replaced below.
  redis.call('ZREM', KEYS[2], member)
  r = nil
end

if not r then
  -- A lease that expires into unknown must never be removed by Redis's TTL:
  -- the TTL is set when the record is settled (see settled).
  if ttl_ms == '0' then
    redis.call('SET', KEYS[1], ARGV[2])
  else
    redis.call('SET', KEYS[1], ARGV[2], 'PX', ttl_ms)
  end
  if expiry_score ~= '0' then
    expiry_indexed(KEYS[3], member, expiry_score, now)
  end
  redis.call('ZADD', KEYS[2], ARGV[3], member)
  return 1
end

if r.state == 'in_progress' and not lease_expired(r, now) then
  -- A key in use: nothing to write. Unless the lease is this very
  -- attempt's: its reservation ran, the reply was lost and the client sent
  -- the call again (go-redis retries a command whose connection broke). The
  -- attempt holds the key, as the first reply would have said.
  local full = r
  if stored then
    full = decode(stored)
  end
  if full.token == decode(ARGV[2]).token then
    return {1, stored or encode(full)}
  end
  return stored or encode(r)
end
if r.state == 'completed' or r.state == 'unknown' then
  -- A replay, or an outcome to reconcile: nothing to write.
  return stored or encode(r)
end
if stored then
  r = decode(stored)
end

local ttl = nil -- what save does with the Redis TTL, when r changed
if lease_expired(r, now) then
  -- Decided on this request; it does not wait for the sweeper.
  r.state = r.lease_expired_state
  r.updated_at = ARGV[1]
  redis.call('ZREM', KEYS[2], member)
  if r.state == 'unknown' then
    turned_unknown(record_keys(), member, r, ARGV[1])
    ttl = 'none'
  else
    expiry_indexed(KEYS[3], member, r.expires_at, now)
    ttl = 'keep'
  end
  notify(r)
end

if r.state == 'released' then
  local new = decode(ARGV[2])
  if r.fingerprint == new.fingerprint then
    -- Take over: a new attempt with a new fencing token. Retention, creation
    -- time and the recovery point are kept; the reconciliation state starts
    -- afresh.
    r.state, r.token, r.locked_until = 'in_progress', new.token, new.locked_until
    r.started_at, r.updated_at = ARGV[1], ARGV[1]
    r.lease_expired_state = new.lease_expired_state
    r.attempts = string.format('%d', tonumber(r.attempts) + 1)
    r.not_replayable, r.status, r.header, r.body = '0', '', '', ''
    r.reconcile_after, r.reconcile_attempts, r.reconcile_error = '0', '0', ''
    r.waiters = '0'
    if ttl_ms == '0' then
      save(KEYS[1], r, 'none')
    else
      save(KEYS[1], r, 'keep')
    end
    redis.call('ZADD', KEYS[2], r.locked_until, member)
    return {1, encode(r)}
  end
end

if ttl then
  save(KEYS[1], r, ttl)
  return encode(r)
end
return stored or encode(r)
