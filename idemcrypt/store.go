package idemcrypt

import (
	"context"
	"errors"
	"fmt"

	"github.com/idem-dev/idem/idemstore"
)

// sealingStore is the encrypting wrapper: an idemstore.Store that seals every
// response it is given to store and opens every response it returns. New
// returns it, or a value embedding it that also implements
// idemstore.Waiter and idemstore.TxStore when the wrapped store does.
type sealingStore struct {
	inner    idemstore.Store
	kr       *Keyring
	required bool
}

// Config configures NewWithConfig. A nil *Config means all defaults.
type Config struct {
	// Keyring seals every stored response under its first key and opens
	// responses sealed under any of its keys. Defaults to nil: nothing is
	// sealed, and sealed records are refused (a *KeyError wrapping
	// ErrUnknownKey).
	Keyring *Keyring
	// Required refuses, with ErrNotSealed, every stored response that is
	// not sealed in the current format: one stored in the clear, which
	// anyone who can write to the store can plant, and one sealed in format
	// v1, which is not bound to its record's fingerprint and creation time.
	// Turn it on once Rotate has sealed every record. Defaults to false:
	// such responses are returned as they are (v1 ones opened), so records
	// stored before encryption was turned on keep replaying.
	Required bool
}

var (
	_ idemstore.Store    = (*sealingStore)(nil)
	_ idemstore.Resealer = (*sealingStore)(nil)
)

// New returns store with every stored response sealed under kr's first key
// and every returned response opened with kr. A nil kr seals nothing and
// refuses sealed records (a *KeyError wrapping ErrUnknownKey), so a process
// started without its keys fails closed instead of replaying ciphertext.
// Responses stored in the clear (before encryption was turned on) are
// returned as they are.
//
// The result implements idemstore.Waiter and idemstore.TxStore exactly when
// store does; its transactions seal the completions written in them and
// return the driver's transaction from Driver, so the drivers'
// TxFromContext keep working. store must not be nil.
func New(store idemstore.Store, kr *Keyring) idemstore.Store {
	return NewWithConfig(store, &Config{Keyring: kr})
}

// NewWithConfig is New with cfg's keyring and, with cfg.Required, the
// refusal of every response not sealed in the current format (ErrNotSealed).
// cfg may be nil.
func NewWithConfig(store idemstore.Store, cfg *Config) idemstore.Store {
	if store == nil {
		panic("idemcrypt: New needs a store")
	}
	var c Config
	if cfg != nil {
		c = *cfg
	}
	s := &sealingStore{inner: store, kr: c.Keyring, required: c.Required}
	w, isWaiter := store.(idemstore.Waiter)
	ts, isTx := store.(idemstore.TxStore)
	switch {
	case isWaiter && isTx:
		return &txWaiterStore{s, w, beginner{ts, s}}
	case isWaiter:
		return &waiterStore{s, w}
	case isTx:
		return &txStore{s, beginner{ts, s}}
	}
	return s
}

type beginner struct {
	ts idemstore.TxStore
	s  *sealingStore
}

// KeyBeginTx begins a transaction of the wrapped store whose completions
// are sealed.
func (b beginner) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	tx, err := b.ts.KeyBeginTx(ctx)
	if err != nil {
		return nil, err
	}
	return &sealingTx{Tx: tx, s: b.s}, nil
}

type sealingTx struct {
	idemstore.Tx
	s *sealingStore
}

// KeyComplete seals the response and completes in the transaction.
func (t *sealingTx) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	q, err := t.s.sealComplete(ctx, p)
	if err != nil {
		return err
	}
	return t.Tx.KeyComplete(ctx, q)
}

type waiterStore struct {
	*sealingStore
	idemstore.Waiter
}

type txStore struct {
	*sealingStore
	beginner
}

type txWaiterStore struct {
	*sealingStore
	idemstore.Waiter
	beginner
}

var (
	_ idemstore.Waiter  = (*waiterStore)(nil)
	_ idemstore.TxStore = (*txStore)(nil)
	_ idemstore.TxStore = (*txWaiterStore)(nil)
	_ idemstore.Waiter  = (*txWaiterStore)(nil)
)

// Unwrap returns the wrapped store.
func (s *sealingStore) Unwrap() idemstore.Store { return s.inner }

// Keyring returns the keyring (nil when there is none).
func (s *sealingStore) Keyring() *Keyring { return s.kr }

// open returns rec with its response opened: rec itself when the response
// is not sealed, else a copy (rec may be shared, see
// idemstore.ReserveResult).
func (s *sealingStore) open(rec *idemstore.Record) (*idemstore.Record, error) {
	if rec == nil || rec.Response == nil {
		return rec, nil
	}
	format, _, sealed := sealedFormat(rec.Response)
	switch {
	case !sealed && s.required:
		return nil, fmt.Errorf("the stored response of record %s: %w (stored in the clear)", rec.LogHash(), ErrNotSealed)
	case !sealed:
		return rec, nil
	case format != formatV2 && s.required:
		return nil, fmt.Errorf("the stored response of record %s: %w (sealed in format %s)", rec.LogHash(), ErrNotSealed, format)
	}
	resp, err := s.kr.Open(BindingOf(rec), rec.Response)
	if err != nil {
		return nil, fmt.Errorf("opening the stored response of record %s: %w", rec.LogHash(), err)
	}
	out := *rec
	out.Response = resp
	return &out, nil
}

// seal returns resp sealed for the record that a write fenced on (id,
// token) stores it on, or resp when there is no keyring. rec is the record
// as the caller reserved or read it, or nil.
func (s *sealingStore) seal(ctx context.Context, id idemstore.Identity, token string, rec *idemstore.Record, resp *idemstore.Response) (*idemstore.Response, error) {
	if s.kr == nil || resp == nil {
		return resp, nil
	}
	b, err := s.binding(ctx, id, token, rec)
	if err != nil {
		return nil, err
	}
	sealed, err := s.kr.Seal(b, resp)
	if err != nil {
		return nil, fmt.Errorf("sealing the response of record %s: %w", id.LogHash(), err)
	}
	return sealed, nil
}

// binding returns the binding of the record a write fenced on (id, token)
// stores its response on: rec's when the caller passed that record, else
// the record's as the store holds it (one read more). When the store holds
// no record of that token, the write that follows fails on its fencing
// whatever it carries, so the binding of what the store holds will do.
func (s *sealingStore) binding(ctx context.Context, id idemstore.Identity, token string, rec *idemstore.Record) (Binding, error) {
	if rec != nil && rec.Identity == id && rec.Token == token {
		return BindingOf(rec), nil
	}
	cur, err := s.inner.KeyGet(ctx, id)
	switch {
	case errors.Is(err, idemstore.ErrNotFound):
		return Binding{Identity: id}, nil
	case err != nil:
		return Binding{}, fmt.Errorf("reading record %s to seal its response: %w", id.LogHash(), err)
	}
	return BindingOf(cur), nil
}

func (s *sealingStore) sealComplete(ctx context.Context, p *idemstore.CompleteParams) (*idemstore.CompleteParams, error) {
	if s.kr == nil || p.Response == nil || p.NotReplayable {
		return p, nil
	}
	q := *p
	var err error
	if q.Response, err = s.seal(ctx, p.Identity, p.Token, p.Record, p.Response); err != nil {
		return nil, err
	}
	return &q, nil
}

// invalidator is implemented by caches in front of a store (idemcache).
type invalidator interface {
	Invalidate(ctx context.Context, id idemstore.Identity) error
}

// KeyReserve reserves through the wrapped store and opens the response of
// the record it returns. A record sealed under a key the keyring does not
// hold fails with a *KeyError wrapping ErrUnknownKey (the middleware
// answers 503 store-unavailable); one that does not open, with ErrOpen, and
// with Config.Required one not sealed in the current format, with
// ErrNotSealed (the middleware answers both 500 response-untrusted). When
// a cache sits below (idemcache), it may hold a copy sealed under a key
// since retired by rotation, or from before rotation sealed it: the copy
// is dropped and the store asked once more.
func (s *sealingStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	res, err := s.inner.KeyReserve(ctx, p)
	if err != nil {
		return nil, err
	}
	rec, err := s.open(res.Record)
	if errors.Is(err, ErrUnknownKey) || errors.Is(err, ErrNotSealed) {
		if inv, ok := s.inner.(invalidator); ok && inv.Invalidate(ctx, p.Identity) == nil {
			if res, err = s.inner.KeyReserve(ctx, p); err != nil {
				return nil, err
			}
			rec, err = s.open(res.Record)
		}
	}
	if err != nil {
		return nil, err
	}
	if rec == res.Record {
		return res, nil
	}
	return &idemstore.ReserveResult{Reserved: res.Reserved, Record: rec}, nil
}

// KeyGet returns the wrapped store's record with its response opened.
func (s *sealingStore) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	rec, err := s.inner.KeyGet(ctx, id)
	if err != nil {
		return nil, err
	}
	return s.open(rec)
}

// KeyComplete seals the response and completes through the wrapped store.
func (s *sealingStore) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	q, err := s.sealComplete(ctx, p)
	if err != nil {
		return err
	}
	return s.inner.KeyComplete(ctx, q)
}

// KeyRelease is the wrapped store's KeyRelease.
func (s *sealingStore) KeyRelease(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyRelease(ctx, p)
}

// KeyMarkUnknown is the wrapped store's KeyMarkUnknown.
func (s *sealingStore) KeyMarkUnknown(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyMarkUnknown(ctx, p)
}

// KeyDelete is the wrapped store's KeyDelete.
func (s *sealingStore) KeyDelete(ctx context.Context, p *idemstore.FinishParams) error {
	return s.inner.KeyDelete(ctx, p)
}

// KeyRenew is the wrapped store's KeyRenew.
func (s *sealingStore) KeyRenew(ctx context.Context, p *idemstore.RenewParams) error {
	return s.inner.KeyRenew(ctx, p)
}

// KeyResolve seals the response of a resolution to completed and resolves
// through the wrapped store.
func (s *sealingStore) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if s.kr != nil && p.Response != nil && p.To == idemstore.StateCompleted {
		q := *p
		var err error
		if q.Response, err = s.seal(ctx, p.Identity, p.Token, p.Record, p.Response); err != nil {
			return err
		}
		p = &q
	}
	return s.inner.KeyResolve(ctx, p)
}

// KeySweep is the wrapped store's KeySweep, responses opened.
func (s *sealingStore) KeySweep(ctx context.Context, p *idemstore.SweepParams) ([]*idemstore.Record, error) {
	recs, err := s.inner.KeySweep(ctx, p)
	if err != nil {
		return nil, err
	}
	return s.openAll(recs)
}

// KeyReap is the wrapped store's KeyReap.
func (s *sealingStore) KeyReap(ctx context.Context, p *idemstore.ReapParams) (int, error) {
	return s.inner.KeyReap(ctx, p)
}

// KeyList is the wrapped store's KeyList with every response opened. A
// record whose response does not open (sealed under a key the keyring does
// not hold, not authenticating, or refused by Config.Required) does not
// fail the page: it is listed with its response as stored, which SealedBy
// names the key of. One such record would otherwise hide every other from
// `idem keys` and the console. Rotate reports them by key.
func (s *sealingStore) KeyList(ctx context.Context, p *idemstore.ListParams) ([]*idemstore.Record, error) {
	recs, err := s.inner.KeyList(ctx, p)
	if err != nil {
		return nil, err
	}
	for i, r := range recs {
		if o, err := s.open(r); err == nil {
			recs[i] = o
		}
	}
	return recs, nil
}

func (s *sealingStore) openAll(recs []*idemstore.Record) ([]*idemstore.Record, error) {
	for i, r := range recs {
		o, err := s.open(r)
		if err != nil {
			return nil, err
		}
		recs[i] = o
	}
	return recs, nil
}

// KeyReseal seals p.Response and reseals through the wrapped store, which
// must implement idemstore.Resealer.
func (s *sealingStore) KeyReseal(ctx context.Context, p *idemstore.ResealParams) error {
	rs, ok := s.inner.(idemstore.Resealer)
	if !ok {
		return fmt.Errorf("idemcrypt: %T cannot rewrite stored responses (no KeyReseal)", s.inner)
	}
	q := *p
	var err error
	if q.Response, err = s.seal(ctx, p.Identity, p.Token, nil, p.Response); err != nil {
		return err
	}
	return rs.KeyReseal(ctx, &q)
}

// Invalidate is the wrapped store's Invalidate (idemcache), when it has one.
func (s *sealingStore) Invalidate(ctx context.Context, id idemstore.Identity) error {
	if inv, ok := s.inner.(invalidator); ok {
		return inv.Invalidate(ctx, id)
	}
	return nil
}

// KeyPurge is the wrapped store's KeyPurge, the purged record's response
// opened. A purge does not depend on the keys: a record whose response does
// not open is purged all the same and returned sealed.
func (s *sealingStore) KeyPurge(ctx context.Context, p *idemstore.PurgeParams) (*idemstore.Record, error) {
	rec, err := s.inner.KeyPurge(ctx, p)
	if err != nil {
		return nil, err
	}
	if o, err := s.open(rec); err == nil {
		return o, nil
	}
	return rec, nil
}

// KeyReconcileClaim is the wrapped store's KeyReconcileClaim (unknown
// records carry no response), responses opened.
func (s *sealingStore) KeyReconcileClaim(ctx context.Context, p *idemstore.ReconcileClaimParams) ([]*idemstore.Record, error) {
	recs, err := s.inner.KeyReconcileClaim(ctx, p)
	if err != nil {
		return nil, err
	}
	return s.openAll(recs)
}

// KeyReconcileFail is the wrapped store's KeyReconcileFail.
func (s *sealingStore) KeyReconcileFail(ctx context.Context, p *idemstore.ReconcileFailParams) error {
	return s.inner.KeyReconcileFail(ctx, p)
}

// KeyBacklog is the wrapped store's KeyBacklog.
func (s *sealingStore) KeyBacklog(ctx context.Context) (*idemstore.Backlog, error) {
	return s.inner.KeyBacklog(ctx)
}
