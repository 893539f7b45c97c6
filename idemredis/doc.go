// Package idemredis is the Redis store of idem, on go-redis v9 and embedded
// Lua scripts. It works with a single node, Sentinel (a failover client) and
// Redis Cluster: pass any redis.UniversalClient. It needs Redis 6.0 or
// later (SET ... KEEPTTL).
//
// # Guarantee
//
// Every state change is one Lua script, so a reservation is atomic (insert,
// take over, or read the existing record in one round trip) and every write
// that finishes an attempt is conditional on its fencing token. A replay is
// one round trip that writes nothing.
//
// Records are only as durable as Redis's persistence is configured. With RDB
// snapshots alone a Redis crash loses the records written since the last
// snapshot, and with asynchronous replication a failover loses the writes
// the replica had not received: a request completed in that window executes
// again on retry, and a lease taken in it can be taken twice. appendonly yes
// with appendfsync always narrows this to failovers; appendfsync everysec to
// about a second. The SQL stores are the durable choice.
//
// # Layout
//
// A record is one string under
//
//	<Prefix>{<bucket>}:r:<sha256>
//
// where sha256 is the hex SHA-256 of the length-prefixed scope, endpoint and
// key, and bucket is one of 1024 buckets taken from that hash. The string
// holds the whole record, the identity too (so records can be listed), in
// a compact form (codec.go): a head of the fields the scripts decide on,
// then the variable fields, so every script reads it with one GET and
// writes it, with its Redis TTL, with one SET. Records written by earlier
// versions, hashes of the same fields, are still read (KeyGet, KeyList,
// every script) and are rewritten as strings by their next write; there is
// nothing to migrate, but a process of an earlier version cannot read the
// new form (it fails closed, answering store-unavailable): stop the old
// processes before the new ones write. Each bucket has two sorted sets: a
// lease index, <Prefix>{<bucket>}:leases, of its in_progress records scored
// by the end of their lease (for KeySweep; a record leaves it when it
// settles), and an expiry index, <Prefix>{<bucket>}:expiry, of its settled
// (completed or released) records, and of in_progress ones that may
// expire in progress (their lease turns released, or outlives their
// retention), scored by expires_at (for KeyReap; about 100 bytes per
// record; unknown records leave it until settled). Two more list the
// unknown records: a backlog index, <Prefix>{<bucket>}:unknown, scored by
// when each turned unknown (for KeyBacklog), and a reconcile index,
// <Prefix>{<bucket>}:reconcile, scored by reconcile_after (for
// KeyReconcileClaim). Each record has a pub/sub channel,
// <Prefix>{<bucket>}:c:<sha256>, on which the scripts publish a change only
// when a KeyWait registered on the record (see KeyWait). A record, its
// indexes and its channel share a hash tag, so every script touches a
// single slot and is Cluster-safe; 1024 buckets spread the records over the
// slots of any realistic cluster. The layout is part of the stored data:
// changing Prefix or the bucket count strands existing records.
//
// A new key costs the server two scripts of seven commands in all
// (reserve: GET, SET, ZADD to the lease index; complete: GET, SET with the
// TTL, ZREM from the lease index, ZADD to the expiry index, and for one
// completion in 16 a pruning ZRANGEBYSCORE), a replay one script of one
// GET. A completion sends the completed record built by the store with the
// one its reservation wrote: the script compares and writes strings, and
// decodes the record only when it changed meanwhile (renewed, waited on).
// A replay returns the stored string as is. A store that completed a
// record, or found it completed, remembers it (for a bounded number of
// recent keys) and replays it with a plain GET instead of the script, a
// fraction of the server's work: the store checks the record as the
// script would, and runs the script (a second round trip) when it is no
// longer completed and retained, as after a purge. A new key is never read
// first. Not with WaitReplicas, nor on a Cluster client that reads from
// replicas.
//
// On a *redis.Client the scripts run as Redis 7 functions (FCALL of one
// library, loaded by the store when the server lacks it), which spares
// each call running lib.lua again; before Redis 7, or without the
// permission, the store falls back to EVALSHA once for good. A Cluster
// client runs them with EVALSHA. Concurrent calls share round trips (see
// Config.MaxBatches).
//
// Times are stored as Unix microseconds from the store's clock (Config.Now),
// passed to the scripts as arguments. Retention is enforced by the scripts
// and KeyGet from the stored expires_at, so a record past it is gone even
// if Redis has not removed it yet (the store's clock may run ahead of
// Redis's, as a test clock does). Redis's own TTL is garbage collection: a
// relative PEXPIRE of the remaining retention plus a minute, set when the
// record is settled (completed or released; at creation already when its
// lease expires into released). A record that may turn unknown has none,
// and one that turns unknown loses it (PERSIST): no TTL ever removes an
// unresolved unknown outcome; settling it starts its retention again. Being relative it does not depend on the two clocks
// agreeing, only on the store's clock not running slower than Redis's (a
// frozen test clock outliving the slack would see records vanish). The lease (locked_until) is
// a field, separate from retention: a crashed attempt blocks its key for one
// lease, not for the retention.
//
// # Costs of the background paths
//
// KeySweep and KeyReap read the indexes of the 1024 buckets (ZRANGEBYSCORE,
// 64 per pipelined round trip: 16 round trips) and run one script per due
// entry, pipelined: their cost is proportional to the buckets and to the
// due entries, never to the number of records. Each handles at most Limit
// records per call. KeyReap is optional: Redis's TTL removes records anyway
// (a minute after ExpiresAt); the reaper reclaims memory sooner and keeps
// the expiry index small. Without it, one settlement in 16 drops up to 64
// expiry index entries that are an hour past due from its bucket (four per
// settlement on average).
//
// KeyList SCANs every master for the prefix and reads the head and identity
// of every record it finds (pipelined GETRANGE), then the full records of the page:
// its cost is proportional to all records under the prefix, per page. It is
// meant for admin tools, not for request paths.
//
// KeyWait (the idemstore.Waiter) subscribes to the record's channel with
// SSUBSCRIBE (sharded pub/sub, Redis 7), or SUBSCRIBE before Redis 7, on a
// connection of its own for the duration of the wait, and registers in the
// record (a write: a count of waiters that the next change publishes to and
// clears).
package idemredis
