-- lib.lua is prepended to every script of the idemredis store, and heads the
-- function library that holds them all (scripts.go), where KEYS and ARGV are
-- locals each function sets before it runs its script.
--
-- Layout: one record is one string, KEYS[1], in the form codec.go describes
-- (a head of comma-separated fields, then the variable fields one after the
-- other, their lengths in the head); a record written by an earlier version
-- is a hash of the same fields, read by load and rewritten as a string by
-- the next write. KEYS[2] is the lease index of the record's bucket: a
-- sorted set of the in_progress records of that bucket, scored by
-- locked_until. KEYS[3], where a script takes it, is the expiry index of the
-- bucket: the settled (completed or released) records of the bucket, and the
-- in_progress ones that may expire in progress (their lease turns released,
-- or outlives their retention), scored by expires_at. The keys share a hash tag, so every script touches one slot
-- and is Cluster-safe. Times are decimal Unix microseconds passed in ARGV
-- from the store's clock; they are stored as the strings given (never
-- formatted by Lua, whose %.14g would round them) and only compared here.

-- HEAD matches the head of a record: the version (2), then state,
-- lease_expired_state, locked_until, expires_at, ttl, created_at,
-- started_at, updated_at, attempts, reconcile_after, reconcile_attempts,
-- waiters, not_replayable, status, and the lengths of token, fingerprint,
-- scope, endpoint, key, recovery_point, reconcile_error and header; the
-- body is the rest. The last capture is where the variable fields start.
local HEAD = '^2,([%l_]*),([%l_]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),([%d-]*),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+),(%d+);()'

-- decode returns the record v as a table, or nil when v is not a record.
-- It keeps the lengths of the variable fields as read (r.lengths) for
-- encode.
local function decode(v)
  local r = {}
  local n = {}
  local p
  r.state, r.lease_expired_state, r.locked_until, r.expires_at, r.ttl,
    r.created_at, r.started_at, r.updated_at, r.attempts, r.reconcile_after,
    r.reconcile_attempts, r.waiters, r.not_replayable, r.status,
    n[1], n[2], n[3], n[4], n[5], n[6], n[7], n[8], p = string.match(v, HEAD)
  if not p then
    return nil
  end
  local q = p + tonumber(n[1])
  r.token = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[2])
  r.fingerprint = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[3])
  r.scope = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[4])
  r.endpoint = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[5])
  r.key = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[6])
  r.recovery_point = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[7])
  r.reconcile_error = string.sub(v, p, q - 1)
  p, q = q, q + tonumber(n[8])
  r.header = string.sub(v, p, q - 1)
  r.body = string.sub(v, q)
  r.lengths = n
  return r
end

-- length returns the length of the i-th variable field, v, for the head:
-- as decode read it when it is the same (Lua formats a number with
-- sprintf, which costs more than the comparison).
local function length(r, i, v)
  local was = r.lengths and r.lengths[i]
  if was and tonumber(was) == #v then
    return was
  end
  return #v
end

-- encode returns the record r as stored.
local function encode(r)
  return table.concat({'2', r.state, r.lease_expired_state, r.locked_until,
      r.expires_at, r.ttl, r.created_at, r.started_at, r.updated_at,
      r.attempts, r.reconcile_after, r.reconcile_attempts, r.waiters,
      r.not_replayable, r.status, length(r, 1, r.token),
      length(r, 2, r.fingerprint), length(r, 3, r.scope),
      length(r, 4, r.endpoint), length(r, 5, r.key),
      length(r, 6, r.recovery_point), length(r, 7, r.reconcile_error),
      length(r, 8, r.header)}, ',')
    .. ';' .. r.token .. r.fingerprint .. r.scope .. r.endpoint .. r.key
    .. r.recovery_point .. r.reconcile_error .. r.header .. r.body
end

-- PEEK matches the first fields of a record's head: what decides whether a
-- reservation finds a record to replay (see load).
local PEEK = '^2,([%l_]*),([%l_]*),([%d-]*),([%d-]*),'

-- UPDATED_AT matches the head of a record and captures its updated_at.
local UPDATED_AT = '^2,[%l_]*,[%l_]*,[%d-]*,[%d-]*,[%d-]*,[%d-]*,[%d-]*,([%d-]*),'

-- DONE matches the head of a completed record and captures its expires_at:
-- a reservation that finds one still retained answers a replay with this
-- one match.
local DONE = '^2,completed,[%l_]*,[%d-]*,([%d-]*),'

-- load_hash reads a record of the earlier layout, a hash, giving the fields
-- it may lack the values they meant.
local function load_hash(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then
    return nil
  end
  local r = {}
  for i = 1, #flat, 2 do
    r[flat[i]] = flat[i + 1]
  end
  r.ttl = r.ttl or string.format('%d', tonumber(r.expires_at) - tonumber(r.created_at))
  r.reconcile_after = r.reconcile_after or '0'
  r.reconcile_attempts = r.reconcile_attempts or '0'
  r.waiters = '0'
  r.not_replayable = r.not_replayable or '0'
  r.status = r.status or ''
  r.recovery_point = r.recovery_point or ''
  r.reconcile_error = r.reconcile_error or ''
  r.header = r.header or ''
  r.body = r.body or ''
  return r
end

-- load returns the record as a table and as stored (nil for a record of
-- the earlier layout), or nil when the key is absent. With peek, the table
-- of a record in the current layout holds only state, lease_expired_state,
-- locked_until and expires_at (a replay needs no more); decode(stored)
-- gives the rest. got, when not nil, is what redis.pcall('GET', key)
-- already returned.
local function load(key, peek, got)
  local v = got
  if v == nil then
    v = redis.pcall('GET', key)
  end
  if not v then
    return nil
  end
  if type(v) == 'table' then
    if v.err and string.find(v.err, '^WRONGTYPE') then
      return load_hash(key)
    end
    error(v.err)
  end
  local r
  if peek then
    r = {}
    r.state, r.lease_expired_state, r.locked_until, r.expires_at = string.match(v, PEEK)
    if not r.state then
      r = nil
    end
  else
    r = decode(v)
  end
  if not r then
    error('IDEM_CORRUPT record ' .. key)
  end
  return r, v
end

-- save stores r at key. ttl says what becomes of the key's Redis TTL: a
-- number of milliseconds sets it, 'keep' keeps it, 'none' removes it.
local function save(key, r, ttl)
  if ttl == 'keep' then
    redis.call('SET', key, encode(r), 'KEEPTTL')
  elseif ttl == 'none' then
    redis.call('SET', key, encode(r))
  else
    redis.call('SET', key, encode(r), 'PX', ttl)
  end
end

-- lease_expired reports whether r is in_progress with a lease that ended at
-- or before now.
local function lease_expired(r, now)
  return r.state == 'in_progress' and tonumber(r.locked_until) <= now
end

-- is_unknown reports whether r is unknown at now: stored so, or an expired
-- lease that turns unknown.
local function is_unknown(r, now)
  return r.state == 'unknown'
    or (lease_expired(r, now) and r.lease_expired_state == 'unknown')
end

-- expired reports whether the record is gone at now: past its retention and
-- not unknown (an unknown record never expires). The store's clock rules,
-- whatever Redis's own TTL says.
local function expired(r, now)
  return tonumber(r.expires_at) < now and not is_unknown(r, now)
end

-- TTL_SLACK_MS is ttlSlack of store.go: Redis's own TTL of a settled record
-- is its remaining retention plus this.
local TTL_SLACK_MS = 60000

-- PRUNE_AFTER_US is pruneAfter of store.go: how long past its expires_at an
-- expiry index entry may be dropped by a settlement in its bucket.
local PRUNE_AFTER_US = 3600000000

-- turned_unknown indexes a record that just turned unknown: the backlog
-- index (scored by when it turned unknown) and the reconcile index (scored
-- by reconcile_after) list it, and the expiry index does not (it is not
-- reapable until settled). The caller saves it with ttl 'none': no Redis TTL
-- may remove it.
-- k: expiry index, unknown index, reconcile index; m: member.
local function turned_unknown(k, m, r, now_arg)
  redis.call('ZREM', k.expiry, m)
  redis.call('ZADD', k.unknown, now_arg, m)
  redis.call('ZADD', k.reconcile, r.reconcile_after, m)
end

-- prunes reports whether expiry_indexed prunes the bucket of member m.
local function prunes(m)
  return string.byte(m, -1) == 48
end

-- expiry_indexed adds a settled record to the expiry index. One settlement
-- in 16 (those whose member, a hex SHA-256, ends in 0: see prunes) also
-- drops up to 64 entries of its bucket that are PRUNE_AFTER_US past due:
-- their records were removed by Redis's TTL long ago, and nobody may run
-- KeyReap. That is four entries per settlement, as often as records expire,
-- for a sixteenth of the lookups. now may be the decimal string of ARGV:
-- it is converted only to prune, and not needed where prunes(m) is false.
local function expiry_indexed(expiry, m, expires_at, now)
  if prunes(m) then
    local stale = redis.call('ZRANGEBYSCORE', expiry, '-inf',
      '(' .. string.format('%d', tonumber(now) - PRUNE_AFTER_US), 'LIMIT', 0, 64)
    if #stale > 0 then
      redis.call('ZREM', expiry, unpack(stale))
    end
  end
  redis.call('ZADD', expiry, expires_at, m)
end

-- settled finishes a record that leaves unknown (or in_progress) for
-- completed or released at now: an unknown one starts its retention again
-- and leaves the unknown indexes; the expiry index lists it. It returns the
-- Redis TTL to save it with, in milliseconds. was_unknown tells whether it
-- was unknown before the change.
local function settled(k, m, r, now, was_unknown)
  local expires_at = tonumber(r.expires_at)
  if was_unknown then
    expires_at = now + tonumber(r.ttl)
    -- Formatted as an integer: %d never rounds like %.14g.
    r.expires_at = string.format('%d', expires_at)
    redis.call('ZREM', k.unknown, m)
    redis.call('ZREM', k.reconcile, m)
  end
  expiry_indexed(k.expiry, m, r.expires_at, now)
  return math.max(math.floor((expires_at - now) / 1000), 0) + TTL_SLACK_MS
end

-- member_of returns the index member of the record at key: the 64 hex
-- digits that end its name (keys.go names a record prefix{bucket}:r:member).
-- A script that takes the member from its key rather than as an argument
-- spares the server an argument (the string's parsing, and its hashing
-- into Lua, cost as much as this substring).
local function member_of(key)
  return string.sub(key, -64)
end

-- channel_of returns the pub/sub channel of the record at key:
-- prefix{bucket}:c:member.
local function channel_of(key)
  return string.sub(key, 1, -68) .. ':c:' .. string.sub(key, -64)
end

-- notify tells the waiters registered on r (KeyWait, see wait.lua) that it
-- changed: a sharded channel in the record's slot on Redis 7, a classic
-- channel before it (channel, or channel_of(KEYS[1]) when nil). Nothing is
-- published when nobody waits. The waiters it wakes register again if they
-- wait again, so the count starts afresh; the caller saves r (or deletes
-- it).
local function notify(r, channel)
  if r.waiters == '0' or r.waiters == '' then
    return
  end
  r.waiters = '0'
  if channel == nil then
    channel = channel_of(KEYS[1])
  end
  if not pcall(redis.call, 'SPUBLISH', channel, '1') then
    redis.call('PUBLISH', channel, '1')
  end
end

local function lease_lost()
  return redis.error_reply('IDEM_LEASE_LOST')
end

local function fenced(r, token)
  return r.token == token
end

-- all_keys_needed is the answer of reserve.lua or complete.lua when they
-- were given the first keys only (two or three) and need all five (args.go,
-- keysOfCall): they return it before they write anything, and the caller
-- sends the call again with the five.
local function all_keys_needed()
  return redis.error_reply('IDEM_ALL_KEYS')
end

-- record_keys names the keys of a script that takes all five: KEYS[1]
-- record, KEYS[2] lease index, KEYS[3] expiry index, KEYS[4] unknown
-- (backlog) index, KEYS[5] reconcile index.
local function record_keys()
  return {record = KEYS[1], leases = KEYS[2], expiry = KEYS[3],
          unknown = KEYS[4], reconcile = KEYS[5]}
end
