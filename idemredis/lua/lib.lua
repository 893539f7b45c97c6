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

-- expired reports whether the record is past its retention at now: it is
-- then gone, whatever Redis's own TTL says (the store's clock rules).
local function expired(r, now)
  return tonumber(r.expires_at) < now
end

-- lease_expired reports whether r is in_progress with a lease that ended at
-- or before now.
local function lease_expired(r, now)
  return r.state == 'in_progress' and tonumber(r.locked_until) <= now
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
