package idemredis

import (
	"context"
	"errors"
	"fmt"
	"hash/maphash"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
)

const (
	// sweepChunk is how many lease indexes one KeySweep round trip reads.
	sweepChunk = 64
	// ttlSlack is added to the remaining retention when Redis's own TTL is
	// set, so that Redis never removes a record that the store's clock
	// still considers alive (it removes it a little later instead).
	ttlSlack = time.Minute
	// pruneAfter is how long past its expires_at an expiry index entry may
	// be dropped by a reservation in the same bucket, its record having been
	// removed by Redis's TTL (ttlSlack after expires_at) long before.
	pruneAfter = time.Hour

	defaultSweepLimit = 1000
	defaultListLimit  = 100
)

// Config configures the store. A nil *Config means all defaults.
type Config struct {
	// Prefix starts every key and channel the store uses, so that several
	// stores and other data can share one Redis. It should not contain a
	// hash tag ("{...}"): that would put every record in one slot. Defaults
	// to "idem:".
	Prefix string
	// Now is the clock. Defaults to time.Now.
	Now func() time.Time
	// RedirectWait bounds how long a call that meets a slot migration of a
	// Redis Cluster (TRYAGAIN, or a MOVED or ASK that go-redis stopped
	// following) keeps retrying when its context has no deadline; with a
	// deadline, it retries until shortly before it. Defaults to 5 seconds.
	RedirectWait time.Duration
	// WaitReplicas, when above zero, makes every call that writes a record
	// (reserve, complete, release, mark unknown, delete, renew, resolve)
	// wait until that many replicas have acknowledged the write (Redis
	// WAIT) before it returns, and fail with ErrNotReplicated when they do
	// not within WaitTimeout: a failover to one of those replicas keeps
	// what the store answered. It needs a *redis.Client (single server or
	// Sentinel) or a *redis.ClusterClient. Defaults to 0: no waiting, the
	// replicas follow asynchronously.
	WaitReplicas int
	// WaitTimeout bounds the wait for WaitReplicas. Defaults to 1 second.
	WaitTimeout time.Duration
	// MaxBatches is how many round trips the store's scripts (reserve,
	// complete, ...) may have in flight at once: a call that comes while
	// they all are waits for the next one, which sends every call queued
	// meanwhile as one pipeline. Under load, Redis and the client then
	// spend one read and one write on many calls instead of one each,
	// which is most of their CPU time per call; a call that finds a round
	// trip free is sent at once. Defaults to 2; a negative value sends
	// every call in its own round trip, on its own connection. Only a
	// *redis.Client (single server or Sentinel) batches, and not with
	// WaitReplicas: a Redis Cluster's pipelines would not follow a moving
	// slot as a single call does.
	MaxBatches int
}

// Store is an idemstore.Store (and idemstore.Waiter) on Redis. It is safe
// for concurrent use.
type Store struct {
	client redis.UniversalClient
	prefix string
	now    func() time.Time
	// sweepFrom rotates the first bucket KeySweep reads, so that a bucket
	// full of expired leases does not starve the others.
	sweepFrom atomic.Uint32
	keys      keyCache
	// redirectWait is Config.RedirectWait.
	redirectWait time.Duration
	// slotRetries counts the calls sent again because a slot was moving.
	slotRetries atomic.Int64
	// waitReplicas and waitTimeout are Config.WaitReplicas and WaitTimeout.
	waitReplicas int
	waitTimeout  time.Duration
	// batch sends the scripts of concurrent calls together, or is nil
	// (Config.MaxBatches).
	batch *batcher
	// functions is set while run calls the scripts as functions (FCALL):
	// on a *redis.Client, until the server turns out to lack them.
	functions atomic.Bool
	// headers decodes the response headers of the records KeyReserve
	// returns, which its callers share: a replay of a key, or of a
	// response with the same headers as another, decodes none.
	headers *headerjson.Cache
	// getReplays lets KeyReserve read a record it saw completed with a
	// plain GET before it runs reserve.lua (see replay): not with
	// WaitReplicas (a reservation then waits for the replicas, even when it
	// reads), nor on a client that may send a GET elsewhere than a script
	// (see readsMaster).
	getReplays bool
}

var (
	_ idemstore.Store  = (*Store)(nil)
	_ idemstore.Waiter = (*Store)(nil)
)

// New returns a store on client: a *redis.Client (single node, or Sentinel
// through redis.NewFailoverClient), a *redis.ClusterClient or a *redis.Ring.
// The store does not close the client.
func New(client redis.UniversalClient, cfg *Config) *Store {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Prefix == "" {
		c.Prefix = "idem:"
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.RedirectWait <= 0 {
		c.RedirectWait = defaultRedirectWait
	}
	if c.WaitTimeout <= 0 {
		c.WaitTimeout = defaultWaitTimeout
	}
	st := &Store{client: client, prefix: c.Prefix, now: c.Now, redirectWait: c.RedirectWait,
		waitReplicas: c.WaitReplicas, waitTimeout: c.WaitTimeout, headers: headerjson.NewCache()}
	st.keys.seed = maphash.MakeSeed()
	if c.MaxBatches == 0 {
		c.MaxBatches = defaultMaxBatches
	}
	_, single := client.(*redis.Client)
	if single && c.MaxBatches > 0 && c.WaitReplicas <= 0 {
		st.batch = &batcher{max: c.MaxBatches}
	}
	// On a Cluster, FUNCTION LOAD would have to reach the node of each
	// call's slot: the scripts are loaded there by EVAL instead.
	st.functions.Store(single)
	st.getReplays = c.WaitReplicas <= 0 && readsMaster(client)
	return st
}

// readsMaster reports whether client sends a GET of a key where it sends a
// script on it: to the master of the key. A Cluster client with ReadOnly
// (or RouteByLatency, RouteRandomly) sends reads to replicas, which lag
// behind: a replay read there could find a record the master no longer
// has. A client of another type is not trusted to.
func readsMaster(client redis.UniversalClient) bool {
	switch c := client.(type) {
	case *redis.Client, *redis.Ring:
		return true
	case *redis.ClusterClient:
		o := c.Options()
		return !o.ReadOnly && !o.RouteByLatency && !o.RouteRandomly
	}
	return false
}

// KeyReserve atomically inserts a new in_progress record, takes over a
// released one (with the same fingerprint) or an expired lease that turns
// released, and otherwise returns the existing record. One script, one
// round trip (two when it finds a lease that ran out: see keysOfCall). A
// record this store saw completed is read with a GET instead (see
// replay), and with the script only when the GET finds it changed.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	now := s.now()
	keys, doneUntil := s.lookupKeys(p.Identity)
	k := keys.boxed
	if s.getReplays && doneUntil >= us(now) {
		res, err := s.replay(ctx, p.Identity, k, us(now))
		if res != nil || err != nil {
			return res, err
		}
	}
	les := p.LeaseExpiredState
	if les == "" {
		les = idemstore.StateUnknown
	}
	lockedUntil, expiresAt, ttl := us(now.Add(p.Lease)), us(now.Add(p.TTL)), max(p.TTL, 0)
	var a reserveArgs
	a.record, a.now, a.lockedUntil = newRecordValue(p, les, us(now), lockedUntil, expiresAt, ttl.Microseconds())
	if les == idemstore.StateReleased {
		// Only a record whose lease cannot turn unknown may have a TTL
		// from the start.
		a.redisTTL = (ttl + ttlSlack).Milliseconds()
	}
	if les == idemstore.StateReleased || lockedUntil > expiresAt {
		// It may expire in progress (its lease turns released, or outlives
		// the retention): KeyReap must find it before it settles.
		a.expiryScore = expiresAt
	}
	cmd := s.run(ctx, reserveScript, a.call(k))
	if needsAllKeys(cmd.Err()) {
		a.allKeys = true
		cmd = s.run(ctx, reserveScript, a.call(k))
	}
	reply, err := cmd.Result()
	if err != nil {
		return nil, fmt.Errorf("reserving key: %w", interpretError(err))
	}
	reserved := false
	var v string
	switch reply := reply.(type) {
	case int64: // inserted
		if reply != 1 {
			return nil, fmt.Errorf("reserving key: unexpected reply %v", reply)
		}
		s.keys.setWritten(p.Identity, a.record)
		return newRecord(p, les, now), nil
	case string: // not reserved: the record as stored
		v = reply
	case []any: // taken over: the record as saved
		if len(reply) != 2 || reply[0] != int64(1) {
			return nil, fmt.Errorf("reserving key: unexpected reply %v", reply)
		}
		var ok bool
		if v, ok = reply[1].(string); !ok {
			return nil, fmt.Errorf("reserving key: unexpected reply %v", reply)
		}
		reserved = true
	default:
		return nil, fmt.Errorf("reserving key: unexpected reply %v", reply)
	}
	rec, err := decodeShared(v, s.headers)
	if err != nil {
		return nil, fmt.Errorf("reserving key: %w", err)
	}
	if reserved {
		s.keys.setWritten(p.Identity, v)
	} else if rec.State == idemstore.StateCompleted {
		// Retained at now, or reserve.lua would have replaced it.
		s.keys.setDone(p.Identity, rec.ExpiresAt.UnixMicro())
	}
	return &idemstore.ReserveResult{Reserved: reserved, Record: rec}, nil
}

// replay reads the record at k with one GET and returns it as KeyReserve
// does when reserve.lua would answer it as it is stored (see replayable):
// completed and retained at now (Unix microseconds). A script is then no
// cheaper for the client, and far dearer for the server, than a GET: the
// answer is the same, the record as stored, and reserve.lua writes nothing
// for it. When the GET finds anything else (no record, one of another
// state, past its retention, of the earlier layout) or Redis answers it
// with an error, replay returns nil and no error, and forgets that the
// record was completed: the caller runs reserve.lua, which decides from
// what it finds then. An error of the connection or of ctx is returned.
//
// KeyReserve calls it only for a record this store saw completed (see
// keySlot.doneUntil), never for a new key, which would pay a second round
// trip: a stale guess (the record was purged, or is being replaced) costs
// one.
func (s *Store) replay(ctx context.Context, id idemstore.Identity, k *boxedKeys, now int64) (*idemstore.ReserveResult, error) {
	cmd := retrySlot(ctx, s, func() *redis.StringCmd {
		// (A StringCmd reads the reply without boxing it.)
		cmd := redis.NewStringCmd(ctx, argGet, k.record)
		cmd.SetFirstKeyPos(1)
		s.process(ctx, cmd)
		return cmd
	})
	v, err := cmd.Result()
	if err != nil {
		var reply redis.Error
		if !errors.As(err, &reply) {
			return nil, fmt.Errorf("reserving key: %w", interpretError(err))
		}
		v = "" // no record (redis.Nil), or Redis refused the GET
	}
	if res := s.keys.lastReplay(id, v); res != nil && res.Record.ExpiresAt.UnixMicro() >= now {
		// The record this store last replayed, unchanged, and still
		// retained: it was decoded then (ReserveResult's record is
		// read-only for its callers).
		return res, nil
	}
	var f recordFields
	if f.parse(v) != nil || !f.replayable(now) {
		s.keys.setDone(id, 0)
		return nil, nil
	}
	rec, err := f.record(s.headers)
	if err != nil {
		return nil, fmt.Errorf("reserving key: %w", err)
	}
	res := &idemstore.ReserveResult{Record: rec}
	s.keys.setReplay(id, v, res)
	return res, nil
}

// newRecord is the result of a reservation that inserted a new record: the
// record reserve.lua wrote from the arguments, with its times at the
// microsecond precision it stores them in.
func newRecord(p *idemstore.ReserveParams, les idemstore.State, now time.Time) *idemstore.ReserveResult {
	at := func(t time.Time) time.Time { return time.UnixMicro(t.UnixMicro()) }
	b := &struct { // one allocation
		res idemstore.ReserveResult
		rec idemstore.Record
	}{}
	b.rec = idemstore.Record{
		Identity:          p.Identity,
		Fingerprint:       p.Fingerprint,
		State:             idemstore.StateInProgress,
		Token:             p.Token,
		LeaseExpiredState: les,
		LockedUntil:       at(now.Add(p.Lease)),
		StartedAt:         at(now),
		CreatedAt:         at(now),
		UpdatedAt:         at(now),
		ExpiresAt:         at(now.Add(p.TTL)),
		TTL:               max(p.TTL, 0).Truncate(time.Microsecond),
		Attempts:          1,
	}
	b.res = idemstore.ReserveResult{Reserved: true, Record: &b.rec}
	return &b.res
}

// KeyGet returns the record, or idemstore.ErrNotFound. It reads with one
// GET (and an HGETALL for a record of the earlier layout) and writes
// nothing.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	r, err := s.getRecord(ctx, s.keysOf(id).record)
	if err != nil {
		return nil, fmt.Errorf("getting key: %w", err)
	}
	now := s.now()
	if expired(r, now) {
		return nil, idemstore.ErrNotFound
	}
	if r.LeaseExpired(now) {
		r.State = r.LeaseExpiredState
	}
	return r, nil
}

// getRecord reads the record stored at key, as stored, or returns
// idemstore.ErrNotFound.
func (s *Store) getRecord(ctx context.Context, key string) (*idemstore.Record, error) {
	v, err := s.client.Get(ctx, key).Result()
	if isWrongType(err) {
		m, err := s.client.HGetAll(ctx, key).Result()
		if err != nil {
			return nil, interpretError(err)
		}
		if len(m) == 0 {
			return nil, idemstore.ErrNotFound
		}
		return recordFromMap(m)
	}
	if err != nil {
		return nil, interpretError(err)
	}
	return decodeRecord(v)
}

// isWrongType reports whether err is Redis's answer to a string command on
// a hash: a record of the earlier layout.
func isWrongType(err error) bool {
	return redis.HasErrorPrefix(err, "WRONGTYPE")
}

// KeyComplete stores the response and moves the record to completed when
// the token matches and the record is in_progress or unknown. A nil
// Response is stored as not replayable.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	resp, err := encodeResponse(p.Response, p.NotReplayable)
	if err != nil {
		return fmt.Errorf("completing key: %w", err)
	}
	a := completeArgs{now: us(s.now()), token: p.Token, resp: resp}
	if v := s.keys.takeWritten(p.Identity); v != "" {
		// The record is likely still the one this store's reservation
		// wrote: the script writes the completed one built here when it
		// finds the start of it, without decoding or encoding a record.
		if rec, proof, ttl, score, ok := completedValue(v, a.now, p.Token, resp); ok {
			a.proof, a.record, a.redisTTL, a.expiryScore = proof, rec, ttl, score
		}
	}
	k := s.keysOf(p.Identity).boxed
	err = s.run(ctx, completeScript, a.call(k)).Err()
	if needsAllKeys(err) {
		a.allKeys = true
		err = s.run(ctx, completeScript, a.call(k)).Err()
	}
	if err != nil {
		return fmt.Errorf("completing key: %w", interpretError(err))
	}
	if exp, err := parseInt(a.expiryScore); err == nil {
		// Completed as the reservation wrote it (or from unknown, with a
		// later expires_at): a retry of it is most likely a replay.
		s.keys.setDone(p.Identity, exp)
	}
	return nil
}

// KeyRelease moves the record to released (from in_progress or unknown)
// when the token matches.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, releaseScript, finishArgs.call, "releasing key", p)
}

// KeyMarkUnknown moves an in_progress record to unknown when the token
// matches.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, markUnknownScript, finishArgs.call, "marking key unknown", p)
}

// KeyDelete removes an in_progress record when the token matches.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, deleteScript, finishArgs.deleteCall, "deleting key", p)
}

// finish runs a fenced script that takes finishArgs, with the command that
// build makes.
func (s *Store) finish(ctx context.Context, sc *script, build func(finishArgs, *boxedKeys) []any, what string, p *idemstore.FinishParams) error {
	a := finishArgs{now: us(s.now()), token: p.Token}
	err := s.run(ctx, sc, build(a, s.keysOf(p.Identity).boxed)).Err()
	if err != nil {
		return fmt.Errorf("%s: %w", what, interpretError(err))
	}
	return nil
}

// KeyRenew extends the lease of an in_progress record to now + p.Lease when
// the token matches.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	now := s.now()
	a := renewArgs{now: us(now), token: p.Token, lockedUntil: us(now.Add(p.Lease))}
	err := s.run(ctx, renewScript, a.call(s.keysOf(p.Identity).boxed)).Err()
	if err != nil {
		return fmt.Errorf("renewing key: %w", interpretError(err))
	}
	return nil
}

// KeyResolve settles an unknown record to completed or released when the
// token matches.
func (s *Store) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if p.To != idemstore.StateCompleted && p.To != idemstore.StateReleased {
		return fmt.Errorf("resolving key to %q: %w", p.To, idemstore.ErrInvalidState)
	}
	resp, err := encodeResponse(p.Response, p.Response == nil)
	if err != nil {
		return fmt.Errorf("resolving key: %w", err)
	}
	a := resolveArgs{now: us(s.now()), token: p.Token, to: string(p.To), resp: resp}
	err = s.run(ctx, resolveScript, a.call(s.keysOf(p.Identity).boxed)).Err()
	if err != nil {
		return fmt.Errorf("resolving key: %w", interpretError(err))
	}
	return nil
}

// needsAllKeys reports whether err is the answer of reserve.lua or
// complete.lua sent with their first keys only that need all five (see
// keysOfCall): they wrote nothing.
func needsAllKeys(err error) bool {
	return err != nil && redis.HasErrorPrefix(err, "IDEM_ALL_KEYS")
}

// interpretError maps Redis replies to the idemstore sentinels: redis.Nil
// and IDEM_NOT_FOUND to ErrNotFound, the scripts' IDEM_LEASE_LOST and
// IDEM_INVALID_STATE to ErrLeaseLost and ErrInvalidState. Any other error
// means the store is unavailable and is returned as it is.
func interpretError(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, redis.Nil), redis.HasErrorPrefix(err, "IDEM_NOT_FOUND"):
		return idemstore.ErrNotFound
	case redis.HasErrorPrefix(err, "IDEM_LEASE_LOST"):
		return idemstore.ErrLeaseLost
	case redis.HasErrorPrefix(err, "IDEM_INVALID_STATE"):
		return idemstore.ErrInvalidState
	}
	return err
}

// expired reports whether r is gone at now, as the scripts' expired decides:
// strictly past its retention and not unknown.
func expired(r *idemstore.Record, now time.Time) bool {
	if !now.After(r.ExpiresAt) || r.State == idemstore.StateUnknown {
		return false
	}
	return !(r.LeaseExpired(now) && r.LeaseExpiredState != idemstore.StateReleased)
}
