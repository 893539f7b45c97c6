-- lib.lua is prepended to every script of the idemredis store.
--
-- Layout: one record is one hash, KEYS[1]. KEYS[2] is the lease index of the
-- record's bucket: a sorted set of the in_progress records of that bucket,
-- scored by locked_until. KEYS[3], where a script takes it, is the expiry
-- index of the bucket: every record of the bucket scored by expires_at. The
-- keys share a hash tag, so every script touches one slot and is
-- Cluster-safe. Times are decimal Unix microseconds passed in
-- ARGV from the store's clock; they are stored as the strings given (never
-- formatted by Lua, whose %.14g would round them) and only compared here.

-- load returns the record hash as a table, or nil when the key is absent.
local function load(key)
  local flat = redis.call('HGETALL', key)
  if #flat == 0 then
    return nil
  end
  local r = {}
  for i = 1, #flat, 2 do
    r[flat[i]] = flat[i + 1]
  end
  return r
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

-- record_ttl is the retention r was reserved with, in microseconds.
local function record_ttl(r)
  if r.ttl then
    return tonumber(r.ttl)
  end
  return tonumber(r.expires_at) - tonumber(r.created_at)
end

-- turned_unknown keeps a record that just turned unknown: no Redis TTL may
-- remove it, the backlog index (scored by when it turned unknown) and the
-- reconcile index (scored by reconcile_after) list it, and the expiry index
-- does not (it is not reapable until settled).
-- k: record, expiry index, unknown index, reconcile index; m: member.
local function turned_unknown(k, m, now_arg)
  redis.call('PERSIST', k.record)
  redis.call('ZREM', k.expiry, m)
  redis.call('ZADD', k.unknown, now_arg, m)
  redis.call('ZADD', k.reconcile, redis.call('HGET', k.record, 'reconcile_after') or '0', m)
end

-- settled finishes a record that leaves unknown (or in_progress) for
-- completed or released at now: an unknown one starts its retention again;
-- its Redis TTL and expiry index entry follow its retention. was_unknown
-- tells whether it was unknown before the change.
local function settled(k, m, r, now, now_arg, was_unknown)
  local expires_at = tonumber(r.expires_at)
  if was_unknown then
    expires_at = now + record_ttl(r)
    -- Formatted as an integer: %d never rounds like %.14g.
    redis.call('HSET', k.record, 'expires_at', string.format('%d', expires_at))
  end
  redis.call('ZREM', k.unknown, m)
  redis.call('ZREM', k.reconcile, m)
  redis.call('ZADD', k.expiry, string.format('%d', expires_at), m)
  redis.call('PEXPIRE', k.record, math.max(math.floor((expires_at - now) / 1000), 0) + TTL_SLACK_MS)
end

-- notify tells waiters (KeyWait) that the record may have changed: a sharded
-- channel in the record's slot on Redis 7, a classic channel before it.
local function notify(channel)
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

-- record_keys names the keys of a script that takes all five: KEYS[1]
-- record, KEYS[2] lease index, KEYS[3] expiry index, KEYS[4] unknown
-- (backlog) index, KEYS[5] reconcile index.
local function record_keys()
  return {record = KEYS[1], leases = KEYS[2], expiry = KEYS[3],
          unknown = KEYS[4], reconcile = KEYS[5]}
end
