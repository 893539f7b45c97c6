package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
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
//   - A write whose context ends while it waits in the queue (or, leading,
//     for the write connection, which a transactional-mode transaction may
//     hold) leaves the queue with the context's error and is never run;
//     once taken into a batch it runs to the end, under a context that is
//     not cancelled (an interrupted statement can roll back SQLite's whole
//     transaction). Waiting for another process's lock, beginning the
//     transaction, is bounded by the busy timeout.
//   - A write that panics fails with an error instead of leaving the writer
//     taken.
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
		b.lead(w)
		return w.err
	}

	select {
	case <-w.wake:
	case <-ctx.Done():
		b.mu.Lock()
		if i := slices.Index(b.queue, w); i >= 0 && !w.lead {
			b.queue = slices.Delete(b.queue, i, i+1)
			b.mu.Unlock()
			return ctx.Err()
		}
		b.mu.Unlock()
		<-w.wake // taken into a batch, or handed the lead: see it through
	}
	if w.lead {
		b.lead(w)
	}
	return w.err
}

// lead runs one batch for the leader, whose write l is the first in the
// queue: it waits for the write connection (as long as l's context allows),
// begins the transaction, takes the writes queued by then, runs them and
// ends the transaction, then hands the lead to the first write queued
// meanwhile, or frees the writer. If l's context ends before the
// connection is free, l alone fails and the next write leads.
func (b *batcher) lead(l *write) {
	var batch []*write
	conn, err := b.db.Conn(l.ctx)
	if err != nil {
		b.mu.Lock()
		b.queue = slices.DeleteFunc(b.queue, func(w *write) bool { return w == l })
		b.mu.Unlock()
		l.err = err
	} else {
		// The transaction must not end with one caller's context: the
		// others' writes are in it.
		tx, err := conn.BeginTx(context.Background(), nil)
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		batch = slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		if err != nil {
			for _, w := range batch {
				w.err = err
			}
		} else {
			b.run(tx, batch)
		}
		conn.Close()
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
		if w != l {
			w.wake <- struct{}{}
		}
	}
	if next != nil {
		next.wake <- struct{}{}
	}
}

// call runs w's write in tx. A panic in it is w's error, so that it
// cannot leave the writer taken for good.
func call(w *write, tx *sql.Tx) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idemsqlite: a write panicked: %v", p)
		}
	}()
	if err := w.ctx.Err(); err != nil {
		return err
	}
	return w.f(context.WithoutCancel(w.ctx), tx)
}

// run runs batch in tx and ends tx, setting each write's err.
func (b *batcher) run(tx *sql.Tx, batch []*write) {
	if len(batch) == 1 {
		w := batch[0]
		if w.err = call(w, tx); w.err != nil {
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
		if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_write"); err != nil {
			doomed = err
			break
		}
		if w.err = call(w, tx); w.err != nil {
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
