// Package idemmem is an in-memory idem store for tests and local development.
//
// It keeps every record in one map behind one mutex, in one process: nothing
// survives a restart and nothing is shared between processes. Responses are
// deep-copied on the way in and in the records KeyGet, KeyList and KeySweep
// return, so callers never alias stored headers or bodies; KeyReserve shares
// the stored response, which its callers only read (see
// idemstore.ReserveResult). Completed records are kept encoded, in memory
// the garbage collector need not scan (see frozen). It implements
// idemstore.Waiter, and idemstore.TxStore with copy-on-write transactions
// whose business writes are string values (Tx.Put), so tests run the
// middleware's transactional mode and phases without a database.
package idemmem

import (
	"bytes"
	"cmp"
	"context"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Default batch sizes, as documented on the idemstore params.
const (
	defaultSweepLimit = 1000
	defaultReapLimit  = 1000
	defaultListLimit  = 100
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Now is the store's clock. Defaults to time.Now.
	Now func() time.Time
}

// Store is an in-memory idemstore.Store. The zero value is not usable; call
// New.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	records recordMap
	// waiters holds, per identity, a channel closed at the next change.
	waiters map[idemstore.Identity]*waiter
	// values are the committed business writes of transactions (Tx.Put).
	values map[string]string
	// replays are the results of the last replays of a few frozen
	// records, by their hash: see replay.
	replays [64]*replayed
	// endpoints are the records' endpoints, shared between records.
	endpoints endpointTable
}

// record is a stored record with room for its response, so that a
// record is few objects for the garbage collector to mark (see
// newRecord). A completed record is kept frozen (see recordMap).
type record struct {
	idemstore.Record
	response idemstore.Response // what Record.Response points to, once completed
	next     *record            // in recordMap, the next record of the same hash
}

// replayed is KeyReserve's result on a frozen record, thawed: kept for
// the next replay of the record, it serves it without an allocation.
// Nothing modifies a completed record in place (no transition leaves
// completed, and a record past its expiry or resealed is replaced by a
// new one), and callers treat the result as read-only (see
// idemstore.ReserveResult), so a replay copies nothing.
type replayed struct {
	f   string // the frozen record, a copy
	res idemstore.ReserveResult
}

// waiter is the wake-up channel of one identity.
type waiter struct {
	ch chan struct{}
	n  int // KeyWait calls parked on ch, for tests
}

var (
	_ idemstore.Store  = (*Store)(nil)
	_ idemstore.Waiter = (*Store)(nil)
)

// New returns an empty Store.
func New(cfg *Config) *Store {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return &Store{
		now:     c.Now,
		records: newRecordMap(),
		waiters: make(map[idemstore.Identity]*waiter),
		values:  make(map[string]string),
	}
}

// live returns the stored record of id unless it is missing or expired
// (idemstore.Record.Expired: never an unknown one). The caller holds s.mu.
func (s *Store) live(id idemstore.Identity, now time.Time) *idemstore.Record {
	if r := s.liveRecord(id, now); r != nil {
		return &r.Record
	}
	return nil
}

// liveRecord is live's record as stored.
func (s *Store) liveRecord(id idemstore.Identity, now time.Time) *record {
	r := s.records.get(id)
	if r == nil || r.Expired(now) {
		return nil
	}
	return r
}

// isUnknown reports whether r is unknown at now, stored so or as an expired
// lease that turns unknown.
func isUnknown(r *idemstore.Record, now time.Time) bool {
	return r.State == idemstore.StateUnknown || (r.LeaseExpired(now) && leaseExpiredState(r) == idemstore.StateUnknown)
}

// settle restarts the retention of r when it leaves unknown. The caller
// holds s.mu and changes r's state next.
func settle(r *idemstore.Record, now time.Time) {
	if isUnknown(r, now) {
		r.ExpiresAt = now.Add(r.TTL)
	}
}

// changed wakes the waiters of id. The caller holds s.mu.
func (s *Store) changed(id idemstore.Identity) {
	if w, ok := s.waiters[id]; ok {
		close(w.ch)
		delete(s.waiters, id)
	}
}

// leaseExpiredState is the state an expired lease of r turns into.
func leaseExpiredState(r *idemstore.Record) idemstore.State {
	if r.LeaseExpiredState == idemstore.StateReleased {
		return idemstore.StateReleased
	}
	return idemstore.StateUnknown
}

// KeyReserve implements idemstore.Store.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()

	var stored *record
	if f, h, ok := s.records.frozenOf(p.Identity); !ok {
		stored = s.liveRecord(p.Identity, now)
	} else if !f.expired(now) {
		return s.replay(f, h), nil
	} // else expired, as if missing: a new record takes its place
	if stored != nil && stored.State == idemstore.StateCompleted {
		return reserveResult(false, &stored.Record), nil // not frozen (see recordMap)
	}
	var r *idemstore.Record
	if stored != nil {
		r = &stored.Record
	}
	if r == nil {
		les := p.LeaseExpiredState
		if les != idemstore.StateReleased {
			les = idemstore.StateUnknown
		}
		n := s.newRecord(p)
		r = &n.Record
		r.State = idemstore.StateInProgress
		r.LockedUntil = now.Add(p.Lease)
		r.StartedAt = now
		r.LeaseExpiredState = les
		r.Attempts = 1
		r.CreatedAt, r.UpdatedAt = now, now
		r.ExpiresAt = now.Add(p.TTL)
		r.TTL = p.TTL
		s.records.put(n)
		s.changed(r.Identity)
		return reserveResult(true, r), nil
	}

	if r.LeaseExpired(now) {
		r.State = leaseExpiredState(r)
		r.UpdatedAt = now
		s.changed(p.Identity)
	}
	if r.State != idemstore.StateReleased || r.Fingerprint != p.Fingerprint {
		return reserveResult(false, r), nil
	}

	r.State = idemstore.StateInProgress
	r.Token = p.Token
	r.LockedUntil = now.Add(p.Lease)
	r.StartedAt = now
	r.UpdatedAt = now
	r.Attempts++
	r.Response = nil
	r.NotReplayable = false
	r.ReconcileAfter, r.ReconcileAttempts, r.ReconcileError = time.Time{}, 0, ""
	if p.LeaseExpiredState == idemstore.StateReleased || p.LeaseExpiredState == idemstore.StateUnknown {
		r.LeaseExpiredState = p.LeaseExpiredState
	}
	s.changed(p.Identity)
	return reserveResult(true, r), nil
}

// replay returns the result of KeyReserve on f, of hash h: the last one,
// when it was f's. A record larger than maxReplayed is thawed each time,
// so that the results kept stay small. The caller holds s.mu.
func (s *Store) replay(f frozen, h uint64) *idemstore.ReserveResult {
	slot := &s.replays[h%uint64(len(s.replays))]
	if e := *slot; e != nil && e.f == string(f) {
		return &e.res
	}
	e := &replayed{f: string(f)}
	e.res.Record = &thaw(e.f, &s.records.headers).Record
	if len(f) <= maxReplayed {
		*slot = e
	}
	return &e.res
}

// maxReplayed bounds the frozen records whose replay Store.replays keeps.
const maxReplayed = 16 << 10

// KeyGet implements idemstore.Store.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if f, _, ok := s.records.frozenOf(id); ok && !f.expired(now) {
		return &f.thaw(nil).Record, nil // a copy already, completed: no lease to view
	}
	r := s.live(id, now)
	if r == nil {
		return nil, idemstore.ErrNotFound
	}
	return viewRecord(r, now), nil
}

// viewRecord copies r as a reader sees it at now: an expired lease is
// reported in the state it turns into.
func viewRecord(r *idemstore.Record, now time.Time) *idemstore.Record {
	c := copyRecord(r)
	if c.LeaseExpired(now) {
		c.State = leaseExpiredState(c)
	}
	return c
}

// fenced returns the live record of id when token owns it and its state is
// one of states, else ErrLeaseLost. The caller holds s.mu.
func (s *Store) fenced(id idemstore.Identity, token string, now time.Time, states ...idemstore.State) (*record, error) {
	r := s.records.get(id)
	if r == nil || r.Expired(now) || r.Token != token || !slices.Contains(states, r.State) {
		return nil, idemstore.ErrLeaseLost
	}
	return r, nil
}

// KeyComplete implements idemstore.Store.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, err := s.fenced(p.Identity, p.Token, now, idemstore.StateInProgress, idemstore.StateUnknown)
	if err != nil {
		return err
	}
	complete(&r.Record, p, p.Response, now)
	if !s.records.put(r) && r.Response != nil { // not frozen (see recordMap): keep a copy
		r.Response = s.storedIn(&r.response, r.Response)
	}
	s.changed(p.Identity)
	return nil
}

// complete completes r, which the attempt owns, at now, with p's outcome;
// resp is p's response as the store keeps it (see Store.stored).
func complete(r *idemstore.Record, p *idemstore.CompleteParams, resp *idemstore.Response, now time.Time) {
	settle(r, now)
	r.State = idemstore.StateCompleted
	r.UpdatedAt = now
	r.NotReplayable = p.NotReplayable || p.Response == nil
	r.Response = nil
	if !r.NotReplayable {
		r.Response = resp
	}
}

// KeyRelease implements idemstore.Store.
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.transition(ctx, p, idemstore.StateReleased, idemstore.StateInProgress, idemstore.StateUnknown)
}

// KeyMarkUnknown implements idemstore.Store.
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.transition(ctx, p, idemstore.StateUnknown, idemstore.StateInProgress)
}

// transition moves the attempt's record to state `to` from one of `from`.
func (s *Store) transition(ctx context.Context, p *idemstore.FinishParams, to idemstore.State, from ...idemstore.State) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, err := s.fenced(p.Identity, p.Token, now, from...)
	if err != nil {
		return err
	}
	if to != idemstore.StateUnknown {
		settle(&r.Record, now)
	}
	r.State = to
	r.UpdatedAt = now
	s.changed(p.Identity)
	return nil
}

// KeyDelete implements idemstore.Store.
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, err := s.fenced(p.Identity, p.Token, s.now(), idemstore.StateInProgress); err != nil {
		return err
	}
	s.records.del(p.Identity)
	s.changed(p.Identity)
	return nil
}

// KeyRenew implements idemstore.Store.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, err := s.fenced(p.Identity, p.Token, now, idemstore.StateInProgress)
	if err != nil {
		return err
	}
	r.LockedUntil = now.Add(p.Lease)
	r.UpdatedAt = now
	return nil
}

// KeyResolve implements idemstore.Store.
func (s *Store) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	if p.To != idemstore.StateCompleted && p.To != idemstore.StateReleased {
		return idemstore.ErrInvalidState
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	n := s.liveRecord(p.Identity, now)
	switch {
	case n == nil:
		return idemstore.ErrNotFound
	case n.Token != p.Token:
		return idemstore.ErrLeaseLost
	case viewRecord(&n.Record, now).State != idemstore.StateUnknown:
		return idemstore.ErrInvalidState
	}
	r := &n.Record
	settle(r, now)
	r.State = p.To
	r.UpdatedAt = now
	r.Response = nil
	r.NotReplayable = false
	if p.To == idemstore.StateCompleted {
		r.Response = s.storedIn(&n.response, p.Response)
		r.NotReplayable = p.Response == nil
		s.records.put(n) // frozen
	}
	s.changed(p.Identity)
	return nil
}

// KeySweep implements idemstore.Store.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := cmp.Or(p.Limit, defaultSweepLimit)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var expired []*idemstore.Record
	for n := range s.records.changing() { // a frozen record is completed: no lease
		if r := &n.Record; !r.Expired(now) && r.LeaseExpired(now) {
			expired = append(expired, r)
		}
	}
	slices.SortFunc(expired, func(a, b *idemstore.Record) int {
		return cmp.Or(a.LockedUntil.Compare(b.LockedUntil), compareIdentity(a.Identity, b.Identity))
	})
	expired = expired[:min(limit, len(expired))]
	out := make([]*idemstore.Record, 0, len(expired))
	for _, r := range expired {
		r.State = leaseExpiredState(r)
		r.UpdatedAt = now
		s.changed(r.Identity)
		out = append(out, copyRecord(r))
	}
	return out, nil
}

// KeyReap implements idemstore.Store.
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, err
	}
	limit := cmp.Or(p.Limit, defaultReapLimit)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	type deadRecord struct {
		expiresAt time.Time
		id        idemstore.Identity
	}
	var dead []deadRecord
	for r := range s.records.changing() {
		if r.Expired(now) {
			dead = append(dead, deadRecord{r.ExpiresAt, r.Identity})
		}
	}
	for f := range s.records.frozen() {
		if f.expired(now) {
			dead = append(dead, deadRecord{f.expiresAt(), f.identity()})
		}
	}
	slices.SortFunc(dead, func(a, b deadRecord) int {
		return cmp.Or(a.expiresAt.Compare(b.expiresAt), compareIdentity(a.id, b.id))
	})
	dead = dead[:min(limit, len(dead))]
	for _, r := range dead {
		s.records.del(r.id)
		s.changed(r.id)
	}
	return len(dead), nil
}

// KeyList implements idemstore.Store.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := cmp.Or(p.Limit, defaultListLimit)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var out []*idemstore.Record
	for n := range s.records.all() {
		r := &n.Record
		if r.Expired(now) {
			continue
		}
		v := viewRecord(r, now)
		if (p.State != "" && v.State != p.State) ||
			(p.Scope != "" && v.Scope != p.Scope) ||
			(p.Endpoint != "" && v.Endpoint != p.Endpoint) ||
			(!p.CreatedBefore.IsZero() && !v.CreatedAt.Before(p.CreatedBefore)) ||
			(p.After != nil && compareIdentity(v.Identity, *p.After) <= 0) {
			continue
		}
		out = append(out, v)
	}
	slices.SortFunc(out, func(a, b *idemstore.Record) int { return compareIdentity(a.Identity, b.Identity) })
	return out[:min(limit, len(out))], nil
}

// KeyPurge implements idemstore.Store.
func (s *Store) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r := s.live(p.Identity, now)
	switch {
	case r == nil:
		return nil, idemstore.ErrNotFound
	case p.Token != "" && r.Token != p.Token:
		return nil, idemstore.ErrLeaseLost
	}
	v := viewRecord(r, now)
	if !p.Force && (v.State == idemstore.StateUnknown || v.State == idemstore.StateInProgress) {
		return nil, idemstore.ErrInvalidState
	}
	s.records.del(p.Identity)
	s.changed(p.Identity)
	return v, nil
}

// KeyReconcileClaim implements idemstore.Store.
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	limit := cmp.Or(p.Limit, defaultListLimit)
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var due []*idemstore.Record
	// A record whose lease ended by graceOver is past its grace; a frozen
	// record is completed.
	graceOver := now.Add(-p.Grace)
	for r := range s.records.changing() {
		if r.State == idemstore.StateUnknown && !r.ReconcileAfter.After(now) &&
			(p.Grace <= 0 || !r.LockedUntil.After(graceOver)) {
			due = append(due, &r.Record)
		}
	}
	slices.SortFunc(due, func(a, b *idemstore.Record) int {
		return cmp.Or(a.ReconcileAfter.Compare(b.ReconcileAfter), a.UpdatedAt.Compare(b.UpdatedAt), compareIdentity(a.Identity, b.Identity))
	})
	due = due[:min(limit, len(due))]
	out := make([]*idemstore.Record, 0, len(due))
	for _, r := range due {
		r.ReconcileAfter = now.Add(p.Hold)
		out = append(out, copyRecord(r))
	}
	return out, nil
}

// KeyReconcileFail implements idemstore.Store.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	r, err := s.fenced(p.Identity, p.Token, now, idemstore.StateUnknown)
	if err != nil {
		return err
	}
	r.ReconcileAttempts++
	r.ReconcileError = idemstore.TruncateReconcileError(p.Error)
	r.ReconcileAfter = now.Add(p.Delay)
	return nil
}

// KeyBacklog implements idemstore.Store.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var b idemstore.Backlog
	for r := range s.records.changing() { // a frozen record is completed
		if r.State != idemstore.StateUnknown {
			continue
		}
		b.Unknown++
		if b.OldestUnknownSince.IsZero() || r.UpdatedAt.Before(b.OldestUnknownSince) {
			b.OldestUnknownSince = r.UpdatedAt
		}
	}
	return &b, nil
}

// KeyWait implements idemstore.Waiter. It returns at once when the record of
// id is missing or not in progress (so a change between the caller's read
// and this call is not missed), else when the record is next written
// (including its deletion), or with ctx's error. A lease that merely expires
// by the clock is no write: callers bound the wait with ctx.
func (s *Store) KeyWait(ctx context.Context, id idemstore.Identity) error {
	s.mu.Lock()
	now := s.now()
	if r := s.live(id, now); r == nil || viewRecord(r, now).State != idemstore.StateInProgress {
		s.mu.Unlock()
		return nil
	}
	w, ok := s.waiters[id]
	if !ok {
		w = &waiter{ch: make(chan struct{})}
		s.waiters[id] = w
	}
	w.n++
	s.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		w.n--
		s.mu.Unlock()
		return ctx.Err()
	}
}

// compareIdentity orders identities by (Scope, Endpoint, Key), bytewise.
func compareIdentity(a, b idemstore.Identity) int {
	return cmp.Or(
		strings.Compare(a.Scope, b.Scope),
		strings.Compare(a.Endpoint, b.Endpoint),
		strings.Compare(a.Key, b.Key),
	)
}

// reserveResult returns a result holding a copy of r that shares r's
// response, in one allocation. The stored response is never modified in
// place, only replaced, and callers treat a reserve result as read-only
// (see idemstore.ReserveResult). A completed record needs no copy (see
// record.replay).
func reserveResult(reserved bool, r *idemstore.Record) *idemstore.ReserveResult {
	b := &struct {
		res idemstore.ReserveResult
		rec idemstore.Record
	}{rec: *r}
	b.res = idemstore.ReserveResult{Reserved: reserved, Record: &b.rec}
	return &b.res
}

// copyRecord returns a deep copy of r.
func copyRecord(r *idemstore.Record) *idemstore.Record {
	c := *r
	c.Response = copyResponse(r.Response)
	return &c
}

// stored returns the copy of resp the store keeps, or nil: its own body,
// and a header shared with the records whose headers are equal (see
// headerTable). Stored records are never changed in place, only replaced.
// The caller holds s.mu.
func (s *Store) stored(resp *idemstore.Response) *idemstore.Response {
	if resp == nil {
		return nil
	}
	return s.storedIn(new(idemstore.Response), resp)
}

// storedIn is stored, written to dst (a record's own room for its
// response, see record) instead of a new allocation. It returns dst, or
// nil when resp is nil. The caller holds s.mu.
func (s *Store) storedIn(dst, resp *idemstore.Response) *idemstore.Response {
	if resp == nil {
		return nil
	}
	*dst = idemstore.Response{
		Status: resp.Status,
		Header: s.records.headers.intern(resp.Header),
		Body:   bytes.Clone(resp.Body),
		Sealed: resp.Sealed,
	}
	return dst
}

// newRecord returns a new record of p's identity, fingerprint and token,
// which it keeps in one allocation of their own (the caller's strings are
// parts of larger ones, or one allocation each) and with an endpoint
// shared with the other records of the endpoint: fewer objects for the
// garbage collector to mark. The caller sets the rest and holds s.mu.
func (s *Store) newRecord(p *idemstore.ReserveParams) *record {
	id := p.Identity
	endpoint, shared := s.endpoints.intern(id.Endpoint)
	packed := id.Scope + id.Key + p.Fingerprint + p.Token
	if !shared {
		packed += id.Endpoint
	}
	n := new(record)
	r := &n.Record
	r.Scope, packed = packed[:len(id.Scope)], packed[len(id.Scope):]
	r.Key, packed = packed[:len(id.Key)], packed[len(id.Key):]
	r.Fingerprint, packed = packed[:len(p.Fingerprint)], packed[len(p.Fingerprint):]
	r.Token, packed = packed[:len(p.Token)], packed[len(p.Token):]
	r.Endpoint = endpoint
	if !shared {
		r.Endpoint = packed
	}
	return n
}

// endpointTable interns the records' endpoints: a service has a few, and
// every record of one can share its string. It keeps at most maxEndpoints
// of at most maxEndpointLength bytes; intern reports false for others.
// The caller holds Store.mu.
type endpointTable struct {
	m map[string]string
}

const (
	maxEndpoints      = 1024
	maxEndpointLength = 256
)

func (t *endpointTable) intern(e string) (string, bool) {
	if shared, ok := t.m[e]; ok {
		return shared, true
	}
	if len(t.m) >= maxEndpoints || len(e) > maxEndpointLength {
		return "", false
	}
	if t.m == nil {
		t.m = make(map[string]string)
	}
	e = strings.Clone(e)
	t.m[e] = e
	return e, true
}

// headerTable interns the headers of stored responses, so that records whose
// headers are equal (every answer of an API that sets Content-Type alone,
// say) share one map instead of keeping a copy each: about 420 bytes a
// record less for the one-header map, and less for the garbage collector to
// mark on every cycle in a store of many live records. Sharing is safe
// because a stored record is read-only (idemstore.ReserveResult; KeyGet
// hands out deep copies). It keeps at most maxHeaderSets headers, each of
// an encoding of at most maxHeaderKey bytes; others are copied as before.
// The caller holds Store.mu.
type headerTable struct {
	sets map[string]http.Header // by headerKey
}

const (
	maxHeaderSets = 1024
	maxHeaderKey  = 1024
)

func (t *headerTable) intern(h http.Header) http.Header {
	if h == nil {
		return nil
	}
	var buf [256]byte
	key := appendHeaderKey(buf[:0], h)
	if shared, ok := t.sets[string(key)]; ok {
		return shared
	}
	c := h.Clone()
	if len(t.sets) < maxHeaderSets && len(key) <= maxHeaderKey {
		if t.sets == nil {
			t.sets = make(map[string]http.Header)
		}
		t.sets[string(key)] = c
	}
	return c
}

// appendHeaderKey appends an encoding of h that two headers share only when
// they are equal: the names in order, each with its values in order, every
// string and count prefixed by its length.
func appendHeaderKey(b []byte, h http.Header) []byte {
	names := make([]string, 0, 8)
	for name := range h {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		b = appendString(b, name)
		vs := h[name]
		b = strconv.AppendInt(b, int64(len(vs)), 10)
		b = append(b, '#')
		for _, v := range vs {
			b = appendString(b, v)
		}
	}
	return b
}

func appendString(b []byte, s string) []byte {
	b = strconv.AppendInt(b, int64(len(s)), 10)
	b = append(b, ':')
	return append(b, s...)
}

// copyResponse returns a deep copy of resp, or nil.
func copyResponse(resp *idemstore.Response) *idemstore.Response {
	if resp == nil {
		return nil
	}
	return &idemstore.Response{
		Status: resp.Status,
		Header: resp.Header.Clone(),
		Body:   bytes.Clone(resp.Body),
		Sealed: resp.Sealed,
	}
}
