// Package idemcache is a read-through replay cache in front of an idem store:
// completed responses are kept in Redis (NewRedis) or in process memory
// (NewLRU, a bounded LRU), so a replay costs no round trip to the SQL store.
//
//	store := idemcache.New(pgStore, idemcache.NewRedis(client, "idemcache:"), &idemcache.Config{Now: now})
//	handler = idem.New(store, cfg)(handler)
//
// # What is cached
//
// Only completed records, and only as the store returned them from
// KeyReserve. KeyReserve looks the identity up in the cache first. A hit is
// answered without touching the store when the cached record is completed,
// belongs to the same identity, carries the request's fingerprint, and is
// still alive by the store's clock (Config.Now) with Config.ExpiryMargin to
// spare. Everything else goes to the store: a miss, an entry past its expiry,
// an entry with another fingerprint, and any cache error or timeout. When the
// store answers with a completed record, the record is written to the cache
// (best effort, bounded by Config.Timeout, never failing the request).
//
// A hit with another fingerprint is not answered from the cache: the
// middleware would answer key-reused, a client bug and rare, and asking the
// store keeps that answer right even in the corner where the cache holds an
// older incarnation of the key than the store does (see below). It costs one
// store round trip per such request.
//
// Completing a key (KeyComplete, or a transactional completion) does not
// fill the cache: the store's record has fields (UpdatedAt, ExpiresAt,
// Attempts) the completion does not return, and a transactional completion
// is only true once its transaction commits. The first replay fills it.
//
// # Why the cache never answers wrongly
//
// A completed record never changes while it is alive. Going through every
// write of idemstore.Store:
//
//   - KeyComplete, KeyRelease and KeyResolve move in_progress or unknown
//     records; KeyMarkUnknown, KeyDelete, KeyRenew and KeySweep move
//     in_progress records only. None of them touches a completed record, and
//     the transactional completion (Tx.KeyComplete) has the same fencing.
//   - KeyReserve returns a completed record unchanged: a completed record
//     is never taken over while alive.
//   - KeyReap deletes records past ExpiresAt, which the cache never serves.
//   - KeyReseal (idemstore.Resealer, encryption key rotation) is the one
//     write that rewrites a completed record: not what it answers, only how
//     its response is sealed. Store.KeyReseal drops the cached copy after
//     the store's write; a copy a racing fill puts back says the same, and
//     idemcrypt discards a copy sealed under a key it no longer holds and
//     asks the store again.
//   - Once a record is past ExpiresAt the key is new again, and the store may
//     hold another incarnation under the same identity. The cache may still
//     hold the old one (a slow fill may even write it back), but it is past
//     its ExpiresAt, so it is never served; the next replay of the new
//     incarnation overwrites it.
//
// So a cached completed record, served only before its ExpiresAt, is exactly
// what the store would answer, and none of those write paths needs to
// invalidate the cache. The only way to change or remove a completed record
// early is outside idemstore.Store (SQL by hand, an operator's purge): such
// a tool must also call Store.Invalidate, or the cache keeps answering the
// record until its ExpiresAt.
//
// The clock is the store's: idem stores take time from their own Config.Now,
// never from the database, so pass the same function. With several app nodes
// whose clocks disagree, a node that runs behind could serve a record from a
// shared cache for up to the skew after a node ahead has already treated the
// key as new; Config.ExpiryMargin (one second by default) absorbs a small
// skew.
//
// A cache shared by several stores must not mix their records: give each
// store (database, schema) its own Redis prefix.
//
// # Why a cache failure costs at most a round trip
//
// The cache is only ever consulted in front of the store and only answers
// completed records; it never decides that a key is new. A miss, an error, a
// timeout, a corrupt entry or an entry of another identity all fall through
// to the store's KeyReserve, which makes the same atomic decision it makes
// without a cache. A cache that is down therefore costs one bounded cache
// call (Config.Timeout) plus the store round trip, never a re-execution.
// After a cache error the cache is bypassed for Config.Backoff, so a dead or
// hanging Redis costs little more than no cache at all, and the failure is
// logged once per backoff rather than once per request.
//
// # Optional interfaces
//
// New returns an idemstore.Store that implements idemstore.Waiter and
// idemstore.TxStore exactly when the wrapped store does, so the middleware's
// wait and transactional modes, and the conformance suite, see the same
// capabilities as without the cache. KeyWait and KeyBeginTx go straight to
// the wrapped store; its transactions are returned unwrapped, so the
// drivers' TxFromContext keep working.
package idemcache
