package idemredis

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/maphash"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/headerjson"
)

const (
	// bucketCount is the number of lease indexes (and hash tags). It is
	// part of the key layout: changing it strands existing records.
	bucketCount = 1024
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
}

// keyCache remembers the keys of recently named records: a request names
// its record at least twice (reserve, then complete or release), a retry
// names it again, and building the names costs a SHA-256 and an
// allocation. A slot holds one identity; another identity that hashes to
// the same slot replaces it.
type keyCache struct {
	seed  maphash.Seed
	slots [256]keySlot
}

type keySlot struct {
	mu   sync.Mutex
	id   idemstore.Identity
	keys recordKeys
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
		waitReplicas: c.WaitReplicas, waitTimeout: c.WaitTimeout}
	st.keys.seed = maphash.MakeSeed()
	return st
}

// recordKeys are the names of one record's keys and channel.
type recordKeys struct {
	record  string // the hash
	index   string // the lease index of its bucket
	expiry  string // the expiry index of its bucket
	member  string // its member in the lease index
	channel string // its pub/sub channel
	// unknown is the backlog index of its bucket: the unknown records
	// scored by when they turned unknown; reconcile is the reconcile index:
	// the same records scored by reconcile_after.
	unknown, reconcile string
	// args are the same names boxed once as script arguments, in the
	// order above; keysOf sets them, bucketKeys does not.
	args *[7]any
}

// keysOf returns the keys of the record named id.
func (s *Store) keysOf(id idemstore.Identity) recordKeys {
	slot := &s.keys.slots[maphash.String(s.keys.seed, id.Key)%uint64(len(s.keys.slots))]
	slot.mu.Lock()
	hit, k := slot.id == id && slot.keys.record != "", slot.keys
	slot.mu.Unlock()
	if hit {
		return k
	}
	k = s.newKeys(id)
	slot.mu.Lock()
	slot.id, slot.keys = id, k
	slot.mu.Unlock()
	return k
}

// newKeys builds the keys of the record named id.
func (s *Store) newKeys(id idemstore.Identity) recordKeys {
	// The hash input is each field's length (8 bytes, big endian) then its
	// bytes; it is built in one buffer, on the stack when small.
	var stack [256]byte
	buf := stack[:0]
	for _, f := range [...]string{id.Scope, id.Endpoint, id.Key} {
		buf = binary.BigEndian.AppendUint64(buf, uint64(len(f)))
		buf = append(buf, f...)
	}
	sum := sha256.Sum256(buf)
	bucket := int(binary.BigEndian.Uint16(sum[:])) % bucketCount
	var member [2 * sha256.Size]byte
	hex.Encode(member[:], sum[:])
	k := s.keysFor(bucket, member[:])
	k.args = &[7]any{k.record, k.index, k.expiry, k.member, k.channel, k.unknown, k.reconcile}
	return k
}

// bucketKeys returns the keys of the record member of bucket.
func (s *Store) bucketKeys(bucket int, member string) recordKeys {
	return s.keysFor(bucket, []byte(member))
}

// keysFor builds the keys of the record member of bucket in one string and
// slices them out of it: one allocation for all of them.
func (s *Store) keysFor(bucket int, member []byte) recordKeys {
	tag := len(s.prefix) + len("{xxx}")
	rec := tag + len(":r:") + len(member)
	idx := tag + len(":leases")
	exp := tag + len(":expiry")
	unk := tag + len(":unknown")
	rcn := tag + len(":reconcile")
	ch := tag + len(":c:") + len(member)
	var b strings.Builder
	b.Grow(rec + idx + exp + ch + unk + rcn)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":r:")
	b.Write(member)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":leases")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":expiry")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":c:")
	b.Write(member)
	s.writeBucketTag(&b, bucket)
	b.WriteString(":unknown")
	s.writeBucketTag(&b, bucket)
	b.WriteString(":reconcile")
	all := b.String()
	o := rec + idx + exp
	return recordKeys{
		record:    all[:rec],
		member:    all[tag+len(":r:") : rec],
		index:     all[rec : rec+idx],
		expiry:    all[rec+idx : o],
		channel:   all[o : o+ch],
		unknown:   all[o+ch : o+ch+unk],
		reconcile: all[o+ch+unk:],
	}
}

func (s *Store) bucketTag(bucket int) string {
	var b strings.Builder
	b.Grow(len(s.prefix) + len("{xxx}"))
	s.writeBucketTag(&b, bucket)
	return b.String()
}

// writeBucketTag writes prefix{xxx}, bucket as three lowercase hex digits
// (as %03x formats it below 4096).
func (s *Store) writeBucketTag(b *strings.Builder, bucket int) {
	const digits = "0123456789abcdef"
	b.WriteString(s.prefix)
	b.WriteByte('{')
	b.WriteByte(digits[bucket>>8&0xf])
	b.WriteByte(digits[bucket>>4&0xf])
	b.WriteByte(digits[bucket&0xf])
	b.WriteByte('}')
}

// micros formats t as decimal Unix microseconds, the scripts' time unit.
func micros(t time.Time) string {
	return strconv.FormatInt(t.UnixMicro(), 10)
}

// us is t in Unix microseconds as a script argument: go-redis sends an
// int64 in decimal, as micros spells it, without the string.
func us(t time.Time) int64 {
	return t.UnixMicro()
}

// KeyReserve atomically inserts a new in_progress record, takes over a
// released one (with the same fingerprint) or an expired lease that turns
// released, and otherwise returns the existing record. One script, one
// round trip.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	les := p.LeaseExpiredState
	if les == "" {
		les = idemstore.StateUnknown
	}
	now := s.now()
	k := s.keysOf(p.Identity)
	ttl := max(p.TTL, 0) + ttlSlack
	a := k.args
	vals, err := s.run(ctx, reserveScript, argKeys5, []any{nil, nil, nil, a[0], a[1], a[2], a[5], a[6],
		us(now), p.Scope, p.Endpoint, p.Key, p.Fingerprint, p.Token,
		us(now.Add(p.Lease)), stateArg(les), us(now.Add(p.TTL)),
		ttl.Milliseconds(), a[3], a[4], us(now.Add(-pruneAfter)), max(p.TTL, 0).Microseconds(),
	}).Slice()
	if err != nil {
		return nil, fmt.Errorf("reserving key: %w", interpretError(err))
	}
	if len(vals) == 0 {
		return nil, errors.New("reserving key: empty reply")
	}
	reserved, _ := vals[0].(int64)
	if reserved == 1 && len(vals) == 1 {
		return newRecord(p, les, now), nil
	}
	rec, err := recordFromFlat(vals[1:])
	if err != nil {
		return nil, fmt.Errorf("reserving key: %w", err)
	}
	return &idemstore.ReserveResult{Reserved: reserved == 1, Record: rec}, nil
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
// HGETALL and writes nothing.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	k := s.keysOf(id)
	m, err := s.client.HGetAll(ctx, k.record).Result()
	if err != nil {
		return nil, fmt.Errorf("getting key: %w", interpretError(err))
	}
	if len(m) == 0 {
		return nil, idemstore.ErrNotFound
	}
	r, err := recordFromMap(m)
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

// KeyComplete stores the response and moves the record to completed when
// the token matches and the record is in_progress or unknown. A nil
// Response is stored as not replayable.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	resp, err := encodeResponse(p.Response, p.NotReplayable)
	if err != nil {
		return fmt.Errorf("completing key: %w", err)
	}
	k := s.keysOf(p.Identity)
	a := k.args
	err = s.run(ctx, completeScript, argKeys5, []any{nil, nil, nil, a[0], a[1], a[2], a[5], a[6],
		us(s.now()), p.Token, resp.notReplayable, resp.status, resp.header, resp.body,
		a[3], a[4],
	}).Err()
	if err != nil {
		return fmt.Errorf("completing key: %w", interpretError(err))
	}
	return nil
}

// KeyRelease moves the record to released (from in_progress or unknown)
// when the token matches.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, releaseScript, argKeys5, "releasing key", p)
}

// KeyMarkUnknown moves an in_progress record to unknown when the token
// matches.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, markUnknownScript, argKeys5, "marking key unknown", p)
}

// KeyDelete removes an in_progress record when the token matches.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	return s.finish(ctx, deleteScript, argKeys3, "deleting key", p)
}

// finish runs a fenced script with the record's first nkeys keys (3: record
// and its lease and expiry indexes; 5: and its unknown and reconcile
// indexes).
func (s *Store) finish(ctx context.Context, sc *script, nkeys any, what string, p *idemstore.FinishParams) error {
	a := s.keysOf(p.Identity).args
	call := []any{nil, nil, nil, a[0], a[1], a[2]}
	if nkeys == argKeys5 {
		call = append(call, a[5], a[6])
	}
	err := s.run(ctx, sc, nkeys, append(call, us(s.now()), p.Token, a[3], a[4])).Err()
	if err != nil {
		return fmt.Errorf("%s: %w", what, interpretError(err))
	}
	return nil
}

// KeyRenew extends the lease of an in_progress record to now + p.Lease when
// the token matches.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	now := s.now()
	k := s.keysOf(p.Identity)
	a := k.args
	err := s.run(ctx, renewScript, argKeys2, []any{nil, nil, nil, a[0], a[1],
		us(now), p.Token, us(now.Add(p.Lease)), a[3],
	}).Err()
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
	k := s.keysOf(p.Identity)
	a := k.args
	err = s.run(ctx, resolveScript, argKeys5, []any{nil, nil, nil, a[0], a[1], a[2], a[5], a[6],
		us(s.now()), p.Token, string(p.To),
		resp.notReplayable, resp.status, resp.header, resp.body,
		a[3], a[4],
	}).Err()
	if err != nil {
		return fmt.Errorf("resolving key: %w", interpretError(err))
	}
	return nil
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

// encodedResponse is a response as the scripts take it. The fields are
// script arguments, boxed once here: the flag and the status from tables of
// interface values that need no allocation.
type encodedResponse struct {
	notReplayable any // "1" or "0"
	status        any // decimal, or "" when not replayable
	header        any // JSON of http.Header, []byte or ""
	body          any // []byte or ""
}

// stateArg is a lease-expired state as a script argument, boxed once.
func stateArg(st idemstore.State) any {
	switch st {
	case idemstore.StateUnknown:
		return argUnknown
	case idemstore.StateReleased:
		return argReleased
	}
	return string(st)
}

var (
	argUnknown, argReleased     any = string(idemstore.StateUnknown), string(idemstore.StateReleased)
	argTrue, argFalse, argEmpty any = "1", "0", ""
	// statusArgs are the statuses net/http lets a handler write.
	statusArgs = func() (t [1000]any) {
		for i := range t {
			t[i] = strconv.Itoa(i)
		}
		return t
	}()
)

func encodeResponse(r *idemstore.Response, notReplayable bool) (encodedResponse, error) {
	if notReplayable || r == nil {
		return encodedResponse{notReplayable: argTrue, status: argEmpty, header: argEmpty, body: argEmpty}, nil
	}
	header, err := headerjson.Encode(r.Header)
	if err != nil {
		return encodedResponse{}, fmt.Errorf("encoding header: %w", err)
	}
	var status any
	if r.Status >= 0 && r.Status < len(statusArgs) {
		status = statusArgs[r.Status]
	} else {
		status = strconv.Itoa(r.Status)
	}
	return encodedResponse{notReplayable: argFalse, status: status, header: header, body: r.Body}, nil
}

// recordFields are a record hash's values, as strings, before decoding.
type recordFields struct {
	scope, endpoint, key, fingerprint, state, token string
	leaseExpiredState, notReplayable, recoveryPoint string
	lockedUntil, startedAt, createdAt, updatedAt    string
	expiresAt, attempts, status, header, body       string
	ttl, reconcileAfter, reconcileAttempts          string
	reconcileError                                  string
	hasStatus                                       bool
}

// set stores value as field k; unknown fields are ignored.
func (f *recordFields) set(k, v string) {
	switch k {
	case "scope":
		f.scope = v
	case "endpoint":
		f.endpoint = v
	case "key":
		f.key = v
	case "fingerprint":
		f.fingerprint = v
	case "state":
		f.state = v
	case "token":
		f.token = v
	case "lease_expired_state":
		f.leaseExpiredState = v
	case "not_replayable":
		f.notReplayable = v
	case "recovery_point":
		f.recoveryPoint = v
	case "locked_until":
		f.lockedUntil = v
	case "started_at":
		f.startedAt = v
	case "created_at":
		f.createdAt = v
	case "updated_at":
		f.updatedAt = v
	case "expires_at":
		f.expiresAt = v
	case "attempts":
		f.attempts = v
	case "status":
		f.status, f.hasStatus = v, true
	case "header":
		f.header = v
	case "body":
		f.body = v
	case "ttl":
		f.ttl = v
	case "reconcile_after":
		f.reconcileAfter = v
	case "reconcile_attempts":
		f.reconcileAttempts = v
	case "reconcile_error":
		f.reconcileError = v
	}
}

// recordFromFlat decodes a field, value, ... list (HGETALL in a script).
func recordFromFlat(vals []any) (*idemstore.Record, error) {
	if len(vals) == 0 || len(vals)%2 != 0 {
		return nil, fmt.Errorf("decoding record: %d values", len(vals))
	}
	var f recordFields
	for i := 0; i < len(vals); i += 2 {
		k, ok1 := vals[i].(string)
		v, ok2 := vals[i+1].(string)
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("decoding record: unexpected %T, %T", vals[i], vals[i+1])
		}
		f.set(k, v)
	}
	return f.record()
}

// recordFromMap decodes a record hash.
func recordFromMap(m map[string]string) (*idemstore.Record, error) {
	var f recordFields
	for k, v := range m {
		f.set(k, v)
	}
	return f.record()
}

// record decodes the fields.
func (f *recordFields) record() (*idemstore.Record, error) {
	// One allocation for the record and its response.
	b := &struct {
		rec  idemstore.Record
		resp idemstore.Response
	}{}
	r := &b.rec
	*r = idemstore.Record{
		Identity: idemstore.Identity{
			Scope:    f.scope,
			Endpoint: f.endpoint,
			Key:      f.key,
		},
		Fingerprint:       f.fingerprint,
		State:             idemstore.State(f.state),
		Token:             f.token,
		LeaseExpiredState: idemstore.State(f.leaseExpiredState),
		NotReplayable:     f.notReplayable == "1",
		RecoveryPoint:     f.recoveryPoint,
	}
	if !r.State.Valid() {
		return nil, fmt.Errorf("decoding record: invalid state %q", r.State)
	}
	var err error
	times := [...]struct {
		field string
		value string
		dst   *time.Time
	}{
		{"locked_until", f.lockedUntil, &r.LockedUntil},
		{"started_at", f.startedAt, &r.StartedAt},
		{"created_at", f.createdAt, &r.CreatedAt},
		{"updated_at", f.updatedAt, &r.UpdatedAt},
		{"expires_at", f.expiresAt, &r.ExpiresAt},
	}
	for _, t := range times {
		if *t.dst, err = parseMicros(t.value); err != nil {
			return nil, fmt.Errorf("decoding record field %s: %w", t.field, err)
		}
	}
	if r.Attempts, err = strconv.Atoi(f.attempts); err != nil {
		return nil, fmt.Errorf("decoding record field attempts: %w", err)
	}
	// Records written before these fields existed have none of them.
	r.TTL = r.ExpiresAt.Sub(r.CreatedAt)
	if f.ttl != "" {
		ttl, err := strconv.ParseInt(f.ttl, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("decoding record field ttl: %w", err)
		}
		r.TTL = time.Duration(ttl) * time.Microsecond
	}
	if f.reconcileAfter != "" && f.reconcileAfter != "0" {
		if r.ReconcileAfter, err = parseMicros(f.reconcileAfter); err != nil {
			return nil, fmt.Errorf("decoding record field reconcile_after: %w", err)
		}
	}
	if f.reconcileAttempts != "" {
		if r.ReconcileAttempts, err = strconv.Atoi(f.reconcileAttempts); err != nil {
			return nil, fmt.Errorf("decoding record field reconcile_attempts: %w", err)
		}
	}
	r.ReconcileError = f.reconcileError
	if f.hasStatus && !r.NotReplayable {
		resp := &b.resp
		resp.Body = []byte(f.body)
		if resp.Status, err = strconv.Atoi(f.status); err != nil {
			return nil, fmt.Errorf("decoding record field status: %w", err)
		}
		if h := f.header; h != "" && h != "null" {
			if resp.Header, err = headerjson.Decode(h); err != nil {
				return nil, fmt.Errorf("decoding record field header: %w", err)
			}
		}
		r.Response = resp
	}
	return r, nil
}

func parseMicros(s string) (time.Time, error) {
	us, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	return time.UnixMicro(us), nil
}

// expired reports whether r is gone at now, as the scripts' expired decides:
// strictly past its retention and not unknown.
func expired(r *idemstore.Record, now time.Time) bool {
	if !now.After(r.ExpiresAt) || r.State == idemstore.StateUnknown {
		return false
	}
	return !(r.LeaseExpired(now) && r.LeaseExpiredState != idemstore.StateReleased)
}

// escapeGlob quotes the characters SCAN MATCH treats as special.
func escapeGlob(s string) string {
	var b strings.Builder
	for _, c := range s {
		switch c {
		case '*', '?', '[', ']', '\\':
			b.WriteByte('\\')
		}
		b.WriteRune(c)
	}
	return b.String()
}
