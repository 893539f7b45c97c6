package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"sync"
	"sync/atomic"
)

// Group commit.
//
// SQLite has one writer, and with synchronous=FULL every commit waits for
// an fsync, so writes that arrive together would queue on one fsync each.
// The batcher groups them instead: the first write to arrive while the
// writer is free becomes the leader, begins a transaction, takes every
// write queued by then (its own first), runs each under a savepoint,
// commits once and hands the results out; writes that arrive meanwhile
// queue, and when the leader is done the first of them leads the next
// batch. A lone write therefore commits at once, as it would alone, and
// under load one fsync serves many writes.
//
// The rules it keeps:
//   - No write is answered before the commit that holds it: the results
//     are handed out after Commit returns, and if the commit fails, every
//     write of the batch gets its error.
//   - One write's failure is its own: a write that fails is rolled back to
//     its savepoint and the batch goes on (a batch of one write rolls the
//     transaction back instead, as a lone write always did). Only what dooms
//     the transaction itself (beginning it, rolling back to a savepoint,
//     committing) fails the whole batch.
//   - Each write sees the ones before it in the batch, as it would had they
//     committed first, so the atomic reserve and the fencing hold inside a
//     batch as between batches.
//   - A write whose context ends while it waits in the queue leaves the
//     queue with the context's error and is never run; once taken into a
//     batch it runs to the end, under a context that is not cancelled (an
//     interrupted statement can roll back SQLite's whole transaction).
type batcher struct {
	db *sql.DB
	// max bounds the writes of one batch.
	max int

	mu      sync.Mutex
	queue   []*write
	leading bool // a leader is running a batch

	// commits and writes count the committed batches and the writes they
	// held, for the tests.
	commits, writes atomic.Int64
	// queued, when set, is called with the queue's length after each write
	// joins it (tests).
	queued func(n int)
}

// write is one write waiting for, or running in, a batch.
type write struct {
	ctx context.Context
	f   func(ctx context.Context, tx *sql.Tx) error
	err error
	// lead is set when the write is handed the lead; wake is signalled when
	// it is done or must lead.
	lead bool
	wake chan struct{}
}

// do runs f in a write transaction shared with the writes that arrive
// together, and returns f's error, or the batch's when it failed, once the
// transaction that holds f's writes committed or rolled back.
func (b *batcher) do(ctx context.Context, f func(ctx context.Context, tx *sql.Tx) error) error {
	w := &write{ctx: ctx, f: f, wake: make(chan struct{}, 1)}
	b.mu.Lock()
	b.queue = append(b.queue, w)
	n, leader := len(b.queue), !b.leading
	b.leading = true
	b.mu.Unlock()
	if b.queued != nil {
		b.queued(n)
	}
	if leader {
		b.lead()
		return w.err
	}

	select {
	case <-w.wake:
	case <-ctx.Done():
		b.mu.Lock()
		if i := indexOf(b.queue, w); i >= 0 && !w.lead {
			b.queue = append(b.queue[:i], b.queue[i+1:]...)
			b.mu.Unlock()
			return ctx.Err()
		}
		b.mu.Unlock()
		<-w.wake // taken into a batch, or handed the lead: see it through
	}
	if w.lead {
		b.lead()
	}
	return w.err
}

func indexOf(q []*write, w *write) int {
	for i, x := range q {
		if x == w {
			return i
		}
	}
	return -1
}

// lead runs one batch: the writes queued once the transaction has begun
// (the leader's own is the first), then hands the lead to the first write
// queued meanwhile, or frees the writer.
func (b *batcher) lead() {
	// The batch's transaction must not end with one caller's context.
	tx, beginErr := b.db.BeginTx(context.Background(), nil)

	b.mu.Lock()
	n := min(len(b.queue), b.max)
	batch := b.queue[:n:n]
	b.queue = b.queue[n:]
	if len(b.queue) == 0 {
		b.queue = nil
	}
	b.mu.Unlock()

	if beginErr != nil {
		for _, w := range batch {
			w.err = beginErr
		}
	} else {
		b.run(tx, batch)
	}

	b.mu.Lock()
	var next *write
	if len(b.queue) > 0 {
		next = b.queue[0]
		next.lead = true
	} else {
		b.leading = false
	}
	b.mu.Unlock()
	for _, w := range batch {
		if !w.lead {
			w.wake <- struct{}{}
		}
	}
	if next != nil {
		next.wake <- struct{}{}
	}
}

// run runs batch in tx and ends tx, setting each write's err.
func (b *batcher) run(tx *sql.Tx, batch []*write) {
	if len(batch) == 1 {
		w := batch[0]
		if w.err = w.ctx.Err(); w.err == nil {
			w.err = w.f(context.WithoutCancel(w.ctx), tx)
		}
		if w.err != nil {
			w.err = errors.Join(w.err, rollback(tx))
			return
		}
		if w.err = tx.Commit(); w.err == nil {
			b.commits.Add(1)
			b.writes.Add(1)
		}
		return
	}

	ctx := context.Background()
	var doomed error // fails the whole batch
	for _, w := range batch {
		if w.err = w.ctx.Err(); w.err != nil {
			continue
		}
		if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_write"); err != nil {
			doomed = err
			break
		}
		if w.err = w.f(context.WithoutCancel(w.ctx), tx); w.err != nil {
			if _, err := tx.ExecContext(ctx, "ROLLBACK TO idem_write"); err != nil {
				doomed = err
				break
			}
		}
		if _, err := tx.ExecContext(ctx, "RELEASE idem_write"); err != nil {
			doomed = err
			break
		}
	}
	if doomed == nil {
		doomed = tx.Commit()
	} else {
		doomed = errors.Join(doomed, rollback(tx))
	}
	if doomed != nil {
		for _, w := range batch {
			if w.err == nil {
				w.err = doomed
			}
		}
		return
	}
	b.commits.Add(1)
	b.writes.Add(int64(len(batch)))
}
