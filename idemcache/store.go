package idemcache

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Defaults of Config.
const (
	// DefaultTimeout is the default Config.Timeout.
	DefaultTimeout = 100 * time.Millisecond
	// DefaultExpiryMargin is the default Config.ExpiryMargin.
	DefaultExpiryMargin = time.Second
	// DefaultBackoff is the default Config.Backoff.
	DefaultBackoff = time.Second
)

// Config configures a Store. A nil *Config means all defaults.
type Config struct {
	// Now is the clock that decides whether a cached record is still alive.
	// It must be the wrapped store's clock. Defaults to time.Now.
	Now func() time.Time
	// Timeout bounds every cache call (a lookup on the request path, a
	// fill, an invalidation). Defaults to DefaultTimeout.
	Timeout time.Duration
	// ExpiryMargin is how long before its ExpiresAt a cached record stops
	// being served from the cache (the store answers instead), to absorb
	// a small skew between Now and the store's clock. Negative means none.
	// Defaults to DefaultExpiryMargin.
	ExpiryMargin time.Duration
	// Backoff is how long the cache is bypassed after a cache error, so a
	// dead or hanging cache is not asked on every request. Negative means
	// never bypass. Defaults to DefaultBackoff.
	Backoff time.Duration
	// Logger receives cache failures. Defaults to slog.Default().
	Logger *slog.Logger
}

func (c *Config) withDefaults() Config {
	var out Config
	if c != nil {
		out = *c
	}
	if out.Now == nil {
		out.Now = time.Now
	}
	if out.Timeout <= 0 {
		out.Timeout = DefaultTimeout
	}
	switch {
	case out.ExpiryMargin == 0:
		out.ExpiryMargin = DefaultExpiryMargin
	case out.ExpiryMargin < 0:
		out.ExpiryMargin = 0
	}
	if out.Backoff == 0 {
		out.Backoff = DefaultBackoff
	}
	if out.Logger == nil {
		out.Logger = slog.Default()
	}
	return out
}

// Store is the caching wrapper: an idemstore.Store that answers replays of
// completed records from a Cache and passes everything else to the wrapped
// store. See the package documentation for why it never answers wrongly.
// New returns it, or a value embedding it that also implements
// idemstore.Waiter and idemstore.TxStore when the wrapped store does.
type Store struct {
	inner idemstore.Store
	cache Cache
	cfg   Config
	// bypassUntil is the wall-clock time (Unix nanoseconds) until which the
	// cache is not asked, after a failure.
	bypassUntil atomic.Int64
}

var _ idemstore.Store = (*Store)(nil)

// New returns store with cache in front of its replays. The result
// implements idemstore.Waiter and idemstore.TxStore exactly when store does
// (the middleware and the conformance suite type-assert them); its dynamic
// type is *Store or a struct embedding *Store. store and cache must not be
// nil.
func New(store idemstore.Store, cache Cache, cfg *Config) idemstore.Store {
	if store == nil || cache == nil {
		panic("idemcache: New needs a store and a cache")
	}
	s := &Store{inner: store, cache: cache, cfg: cfg.withDefaults()}
	w, isWaiter := store.(idemstore.Waiter)
	ts, isTx := store.(idemstore.TxStore)
	switch {
	case isWaiter && isTx:
		return &txWaiterStore{s, waiter{w}, beginner{ts}}
	case isWaiter:
		return &waiterStore{s, waiter{w}}
	case isTx:
		return &txStore{s, beginner{ts}}
	}
	return s
}

type waiter struct{ w idemstore.Waiter }

// KeyWait is the wrapped store's KeyWait.
func (w waiter) KeyWait(ctx context.Context, id idemstore.Identity) error {
	return w.w.KeyWait(ctx, id)
}

type beginner struct{ ts idemstore.TxStore }

// KeyBeginTx is the wrapped store's KeyBeginTx. The transaction is returned
// as is: a completion in it does not fill the cache (the first replay does).
func (b beginner) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	return b.ts.KeyBeginTx(ctx)
}

type waiterStore struct {
	*Store
	waiter
}

type txStore struct {
	*Store
	beginner
}

type txWaiterStore struct {
	*Store
	waiter
	beginner
}

var (
	_ idemstore.Waiter  = (*waiterStore)(nil)
	_ idemstore.TxStore = (*txStore)(nil)
	_ idemstore.TxStore = (*txWaiterStore)(nil)
	_ idemstore.Waiter  = (*txWaiterStore)(nil)
)

// Unwrap returns the wrapped store.
func (s *Store) Unwrap() idemstore.Store { return s.inner }

// Invalidate removes the cached record of id. Anything that changes or
// deletes a completed record outside idemstore.Store (SQL by hand, an
// operator's purge) must call it, or the cache keeps answering the record
// until its ExpiresAt. It is not bypassed after failures and returns the
// cache's error. New returns an idemstore.Store; reach Invalidate through
// the interface { Invalidate(context.Context, idemstore.Identity) error }, or
// call the Cache's Delete, which does the same.
func (s *Store) Invalidate(ctx context.Context, id idemstore.Identity) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	return s.cache.Delete(ctx, id)
}

// KeyReserve answers a replay of a completed record from the cache when it
// can, and otherwise asks the wrapped store, filling the cache when the
// store answers with a completed record.
func (s *Store) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	if rec := s.lookup(ctx, p); rec != nil {
		return &idemstore.ReserveResult{Record: rec}, nil
	}
	res, err := s.inner.KeyReserve(ctx, p)
	if err != nil {
		return nil, err
	}
	if !res.Reserved && res.Record != nil && res.Record.State == idemstore.StateCompleted &&
		res.Record.Identity == p.Identity {
		s.fill(ctx, res.Record)
	}
	return res, nil
}

// lookup returns the cached record that answers p, or nil when the store
// must decide.
func (s *Store) lookup(ctx context.Context, p *idemstore.ReserveParams) *idemstore.Record {
	if s.bypassed() || ctx.Err() != nil {
		return nil
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	rec, err := s.cache.Get(cctx, p.Identity)
	cancel()
	if err != nil {
		s.failed(ctx, "get", err)
		return nil
	}
	if rec == nil || rec.Identity != p.Identity || rec.State != idemstore.StateCompleted {
		return nil
	}
	if !s.servable(rec) {
		// Past its expiry (or nearly): the store decides, and the entry
		// is dropped so it does not occupy the cache.
		s.delete(ctx, p.Identity)
		return nil
	}
	if rec.Fingerprint != p.Fingerprint {
		return nil // the store answers key-reused (see the package doc)
	}
	return rec
}

// servable reports whether rec may be answered from the cache now.
func (s *Store) servable(rec *idemstore.Record) bool {
	return s.cfg.Now().Add(s.cfg.ExpiryMargin).Before(rec.ExpiresAt)
}

// fill writes a completed record to the cache, best effort: the request's
// answer does not depend on it.
func (s *Store) fill(ctx context.Context, rec *idemstore.Record) {
	if s.bypassed() || !s.servable(rec) {
		return
	}
	base := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(base, s.cfg.Timeout)
	defer cancel()
	if err := s.cache.Set(cctx, rec); err != nil {
		s.failed(base, "set", err)
	}
}

// delete removes a cache entry, best effort.
func (s *Store) delete(ctx context.Context, id idemstore.Identity) {
	base := context.WithoutCancel(ctx)
	cctx, cancel := context.WithTimeout(base, s.cfg.Timeout)
	defer cancel()
	if err := s.cache.Delete(cctx, id); err != nil {
		s.failed(base, "delete", err)
	}
}

// bypassed reports whether the cache is skipped after a recent failure.
func (s *Store) bypassed() bool {
	until := s.bypassUntil.Load()
	return until != 0 && time.Now().UnixNano() < until
}

// failed logs a cache failure and starts a backoff, unless the caller's
// context ctx ended (the cache is not to blame) or a backoff is already
// running (the failure was logged). The backoff runs on the wall clock, not
// on Config.Now: it measures the cache's real unavailability.
func (s *Store) failed(ctx context.Context, op string, err error) {
	if ctx.Err() != nil {
		return
	}
	if s.cfg.Backoff < 0 {
		s.cfg.Logger.Warn("idem: replay cache failed; asking the store", "op", op, "error", err)
		return
	}
	now := time.Now()
	old := s.bypassUntil.Load()
	if old != 0 && now.UnixNano() < old {
		return
	}
	if s.bypassUntil.CompareAndSwap(old, now.Add(s.cfg.Backoff).UnixNano()) {
		s.cfg.Logger.Warn("idem: replay cache failed; asking the store without it for a while",
			"op", op, "backoff", s.cfg.Backoff, "error", err)
	}
}

// KeyGet is the wrapped store's KeyGet.
func (s *Store) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	return s.inner.KeyGet(ctx, id)
}

// KeyComplete is the wrapped store's KeyComplete. It does not fill the
// cache: the first replay does.
func (s *Store) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	return s.inner.KeyComplete(ctx, p)
}

// KeyRelease is the wrapped store's KeyRelease (in_progress or unknown
// records only: nothing cached changes).
func (s *Store) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyRelease(ctx, p)
}

// KeyMarkUnknown is the wrapped store's KeyMarkUnknown (in_progress records
// only: nothing cached changes).
func (s *Store) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyMarkUnknown(ctx, p)
}

// KeyDelete is the wrapped store's KeyDelete (in_progress records only:
// nothing cached changes).
func (s *Store) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyDelete(ctx, p)
}

// KeyRenew is the wrapped store's KeyRenew.
func (s *Store) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	return s.inner.KeyRenew(ctx, p)
}

// KeyResolve is the wrapped store's KeyResolve (unknown records only: a
// record resolved to completed is cached by its first replay).
func (s *Store) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	return s.inner.KeyResolve(ctx, p)
}

// KeySweep is the wrapped store's KeySweep.
func (s *Store) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	return s.inner.KeySweep(ctx, p)
}

// KeyReap is the wrapped store's KeyReap. It needs no invalidation: the
// records it deletes are past ExpiresAt, which the cache never serves.
func (s *Store) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	return s.inner.KeyReap(ctx, p)
}

// KeyList is the wrapped store's KeyList.
func (s *Store) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	return s.inner.KeyList(ctx, p)
}

// KeyPurge is the wrapped store's KeyPurge, with the record's cache entry
// removed before and after it (a purged completed record must not be
// replayed from the cache; removing it after too drops an entry a
// concurrent replay filled in between). The removal is best effort, as
// every cache call: a cache that fails it is logged and bypassed for
// Config.Backoff; call Invalidate once it is back.
func (s *Store) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	s.delete(ctx, p.Identity)
	rec, err := s.inner.KeyPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	s.delete(ctx, p.Identity)
	return rec, nil
}

// KeyReconcileClaim is the wrapped store's KeyReconcileClaim (unknown
// records only: never cached).
func (s *Store) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	return s.inner.KeyReconcileClaim(ctx, p)
}

// KeyReconcileFail is the wrapped store's KeyReconcileFail.
func (s *Store) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	return s.inner.KeyReconcileFail(ctx, p)
}

// KeyBacklog is the wrapped store's KeyBacklog.
func (s *Store) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	return s.inner.KeyBacklog(ctx)
}
