package idemmem

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

var _ idemstore.TxStore = (*Store)(nil)

// ErrTxDone is returned by the methods of a Tx that was already committed
// or rolled back.
var ErrTxDone = errors.New("idemmem: transaction already committed or rolled back")

// KeyBeginTx begins a copy-on-write transaction for the middleware's
// transactional mode (idemstore.TxStore), so that the memory store runs
// transactional requests and phases like the SQL stores do.
//
// A transaction sees its own writes and nobody else does until Commit, which
// applies them all under the store's lock or none of them. Its key writes are
// fenced twice: when they are made, against the record as the transaction
// sees it, and again at Commit, against the record as it is then, exactly as
// the store's own fenced writes are. Unlike the SQL stores it takes no lock
// while it is open: an attempt whose lease is taken over meanwhile is not
// waited for but fails at Commit with idemstore.ErrLeaseLost, so the two
// never both win. The application's business writes are the values of Put,
// which commit and roll back with the key (see Store.Values).
func (s *Store) KeyBeginTx(ctx context.Context) (idemstore.Tx, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return &Tx{s: s}, nil
}

// Tx is a transaction begun by KeyBeginTx. It implements idemstore.Tx, and
// Driver returns it; handlers reach it through TxFromContext, and code
// handed an idemstore.Tx (a phase of idem.RunPhases) through TxFrom.
type Tx struct {
	s *Store

	mu   sync.Mutex
	done bool
	// ops are the key writes in order, replayed at Commit.
	ops []txOp
	// views are the records as the transaction sees them: the store's,
	// with ops applied.
	views map[idemstore.Identity]*idemstore.Record
	// values are the business writes.
	values map[string]string
}

// txOp is one key write of a transaction, made at now.
type txOp struct {
	id    idemstore.Identity
	now   time.Time
	apply func(r *idemstore.Record, now time.Time) error
}

var _ idemstore.Tx = (*Tx)(nil)

// KeyComplete writes the completion in the transaction, fenced like
// Store.KeyComplete.
func (t *Tx) KeyComplete(ctx context.Context, p *idemstore.CompleteParams) error {
	t.s.mu.Lock()
	resp := t.s.stored(p.Response)
	t.s.mu.Unlock()
	p = &idemstore.CompleteParams{Identity: p.Identity, Token: p.Token, Response: resp, NotReplayable: p.NotReplayable}
	return t.write(ctx, p.Identity, func(r *idemstore.Record, now time.Time) error {
		if err := fence(r, p.Token, idemstore.StateInProgress, idemstore.StateUnknown); err != nil {
			return err
		}
		complete(r, p, resp, now)
		return nil
	})
}

// KeyCheckpoint records the recovery point in the transaction, fenced on
// the token of an in_progress record. It does not extend the lease.
func (t *Tx) KeyCheckpoint(ctx context.Context, p *idemstore.CheckpointParams) error {
	token, point := p.Token, p.RecoveryPoint
	return t.write(ctx, p.Identity, func(r *idemstore.Record, now time.Time) error {
		if err := fence(r, token, idemstore.StateInProgress); err != nil {
			return err
		}
		r.RecoveryPoint = point
		r.UpdatedAt = now
		return nil
	})
}

// write applies op to the transaction's view of id and keeps it for Commit.
func (t *Tx) write(ctx context.Context, id idemstore.Identity, op func(r *idemstore.Record, now time.Time) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	t.s.mu.Lock()
	now := t.s.now()
	view, seen := t.views[id]
	if !seen {
		view = t.s.live(id, now)
	}
	t.s.mu.Unlock()
	if view == nil {
		return idemstore.ErrLeaseLost
	}
	// The store's record is not touched before Commit: write a copy.
	next := *view
	if err := op(&next, now); err != nil {
		return err
	}
	if t.views == nil {
		t.views = make(map[idemstore.Identity]*idemstore.Record)
	}
	t.views[id] = &next
	t.ops = append(t.ops, txOp{id: id, now: now, apply: op})
	return nil
}

// Put writes value under name in the transaction: a business write that
// the store makes visible (Store.Values) when the transaction commits.
func (t *Tx) Put(name, value string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	if t.values == nil {
		t.values = make(map[string]string)
	}
	t.values[name] = value
	return nil
}

// Get returns the value of name as the transaction sees it: its own write,
// else the committed one.
func (t *Tx) Get(name string) (string, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if v, ok := t.values[name]; ok {
		return v, true
	}
	t.s.mu.Lock()
	defer t.s.mu.Unlock()
	v, ok := t.s.values[name]
	return v, ok
}

// Commit applies the transaction's writes under the store's lock, each
// fenced again on the record as it is now, or none of them: when one fails
// it returns idemstore.ErrLeaseLost and the transaction is rolled back.
func (t *Tx) Commit(ctx context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.done {
		return ErrTxDone
	}
	t.done = true
	if err := ctx.Err(); err != nil {
		return err
	}
	s := t.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	next := make(map[idemstore.Identity]*record, len(t.views))
	for _, op := range t.ops {
		r, ok := next[op.id]
		if !ok {
			cur := s.live(op.id, now)
			if cur == nil {
				return fmt.Errorf("committing: %w", idemstore.ErrLeaseLost)
			}
			r = &record{Record: *cur}
			next[op.id] = r
		}
		if err := op.apply(&r.Record, op.now); err != nil {
			return fmt.Errorf("committing: %w", err)
		}
	}
	for _, r := range next {
		s.records.put(r)
		s.changed(r.Identity)
	}
	maps.Copy(s.values, t.values)
	return nil
}

// Rollback discards the transaction's writes; after Commit or Rollback it
// does nothing.
func (t *Tx) Rollback(context.Context) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.done = true
	return nil
}

// Driver returns t itself: the business writes of the memory store are
// its Put and Get.
func (t *Tx) Driver() any { return t }

// TxFrom returns the *Tx of tx, a transaction begun by KeyBeginTx
// (directly or through a store that wraps this one, such as idemcrypt or
// idemcache), and false for a nil tx or any other store's transaction. A
// phase of idem.RunPhases reaches its transaction through it.
func TxFrom(tx idemstore.Tx) (*Tx, bool) {
	if tx == nil {
		return nil, false
	}
	mtx, ok := tx.Driver().(*Tx)
	return mtx, ok
}

// TxFromContext returns the business transaction of a request in
// transactional mode, beginning it on first use, or idemstore.ErrNoTx. The
// handler writes through it; the middleware completes the key in it and
// commits. It is TxFrom of the context's transaction.
func TxFromContext(ctx context.Context) (*Tx, error) {
	tx, err := idemstore.TxFromContext(ctx)
	if err != nil {
		return nil, err
	}
	mtx, ok := TxFrom(tx)
	if !ok {
		return nil, fmt.Errorf("idemmem: the request's transaction is a %T, not an *idemmem.Tx", tx.Driver())
	}
	return mtx, nil
}

// Values returns a copy of the committed business values (Tx.Put).
func (s *Store) Values() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.values)
}

// fence returns ErrLeaseLost unless token owns r and r's state is one of
// states: the check of Store.fenced on a record already known to be live.
func fence(r *idemstore.Record, token string, states ...idemstore.State) error {
	for _, st := range states {
		if r.Token == token && r.State == st {
			return nil
		}
	}
	return idemstore.ErrLeaseLost
}
