package idemsqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/idem-dev/idem/idemstore"
)

// Group commit.
//
// SQLite has one writer, and with synchronous=FULL every commit waits for
// an fsync, so writes that arrive together would queue on one fsync each.
// The batcher groups them instead: the first write to arrive while the
// writer is free becomes the leader, begins a transaction, lets the
// goroutines ready to run go first (those a commit just woke come back
// together with their next writes), takes every write queued by then (its
// own first), runs each under a savepoint, commits once and hands the
// results out; writes that arrive meanwhile queue, and when the leader is
// done the first of them leads the next batch. A lone write therefore
// commits at once, as it would alone, and under load one fsync serves many
// writes.
//
// The rules it keeps:
//   - No write is answered before the commit that holds it: the results
//     are handed out after Commit returns, and if the commit fails, every
//     write of the batch gets its error.
//   - One write's failure is its own: the batch goes on without what it
//     wrote, and only what dooms the transaction itself (beginning it,
//     rolling back to a savepoint, committing) fails the whole batch. A
//     write that may write more than once runs under a savepoint and is
//     rolled back to it when it fails. A write marked atomic (one
//     statement writes, the last, and it fails alone: a failed statement
//     is undone by SQLite) runs without one, as a savepoint per write costs
//     a tenth of the write: when it fails without having written (its
//     fenced statement changed no row: idemstore.ErrLeaseLost; or its
//     context ended before it ran) the batch goes on; when it fails
//     otherwise (the statement failed: SQLite may have rolled back the
//     whole transaction rather than the statement), the transaction is
//     rolled back and the batch's other writes run again, each under a
//     savepoint, in a new one. A batch of one write rolls the transaction
//     back when it fails, as a lone write always did. So a write may run
//     more than once; only its last run's writes commit.
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

	// stmts are the prepared statements made for the running transaction
	// (Tx.StmtContext), by the pool's: the batch's writes share them. Only
	// the leader, running the batch, uses it.
	stmts map[*sql.Stmt]*sql.Stmt

	mu      sync.Mutex
	queue   []*write
	leading bool // a leader is running a batch

	// commits and writes count the committed batches and the writes they
	// held, for the tests.
	commits, writes atomic.Int64
	// reruns counts the batches that ran again after an atomic write
	// failed, for the tests.
	reruns atomic.Int64
	// queued, when set, is called with the queue's length after each write
	// joins it (tests).
	queued func(n int)
	// committed, when set, is called by the leader with the number of
	// writes of each batch that committed (tests and benchmarks).
	committed func(n int)
}

// write is one write waiting for, or running in, a batch.
type write struct {
	ctx context.Context
	f   func(ctx context.Context, tx *sql.Tx) error
	// atomic marks a write whose one writing statement is its last: it
	// needs no savepoint (see batcher).
	atomic bool
	err    error
	// lead is set when the write is handed the lead; wake is signalled when
	// it is done or must lead.
	lead bool
	wake chan struct{}
}

// do runs f in a write transaction shared with the writes that arrive
// together, and returns f's error, or the batch's when it failed, once the
// transaction that holds f's writes committed or rolled back. atomic marks
// f as a write that writes with its last statement only, and returns
// idemstore.ErrLeaseLost only when that statement changed nothing; f may
// run more than once (see batcher).
func (b *batcher) do(ctx context.Context, atomic bool, f func(ctx context.Context, tx *sql.Tx) error) error {
	w := &write{ctx: ctx, f: f, atomic: atomic, wake: make(chan struct{}, 1)}
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
		// Begin before taking the batch: the writes that queue meanwhile
		// join it. The transaction must not end with one caller's
		// context: the others' writes are in it.
		tx, err := conn.BeginTx(context.Background(), nil)
		// And let the goroutines that are ready to run go first, until
		// they bring no more writes: a commit wakes all the writers it
		// held at once, and the first of them back with its next write
		// would otherwise lead a batch of one while the others, already
		// runnable, queue behind it for the commit after. Yielding costs
		// nothing when no other goroutine is ready (an idle server's lone
		// write commits at once) and waits for none that is not.
		b.gather()
		b.mu.Lock()
		n := min(len(b.queue), b.max)
		batch = slices.Clone(b.queue[:n])
		b.queue = slices.Delete(b.queue, 0, n)
		b.mu.Unlock()
		b.run(conn, tx, err, batch)
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

// gather yields the processor to the goroutines ready to run until a yield
// queues no new write or the queue holds a full batch.
func (b *batcher) gather() {
	for n := -1; ; {
		b.mu.Lock()
		m := len(b.queue)
		b.mu.Unlock()
		if m == n || m >= b.max {
			return
		}
		n = m
		runtime.Gosched()
	}
}

// call runs w's write in tx, and reports whether it ran: a write whose
// context ended before is not run. A panic in it is w's error, so that it
// cannot leave the writer taken for good.
func call(w *write, tx *sql.Tx) (ran bool, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("idemsqlite: a write panicked: %v", p)
		}
	}()
	if err := w.ctx.Err(); err != nil {
		return false, err
	}
	return true, w.f(context.WithoutCancel(w.ctx), tx)
}

// run runs batch on conn in tx, begun with err, or in two transactions
// when an atomic write failed in the first (see batcher), and sets each
// write's err.
func (b *batcher) run(conn *sql.Conn, tx *sql.Tx, err error, batch []*write) {
	ctx := context.Background()
	ws, savepoints := batch, false
	for {
		if err != nil {
			for _, w := range ws {
				w.err = err
			}
			return
		}
		redo, committed := b.runTx(ctx, tx, ws, savepoints)
		if redo < 0 {
			if committed {
				b.commits.Add(1)
				b.writes.Add(int64(len(batch)))
				if b.committed != nil {
					b.committed(len(batch))
				}
			}
			return
		}
		// ws[redo] failed: it keeps its error; the others run again.
		b.reruns.Add(1)
		ws, savepoints = slices.Delete(slices.Clone(ws), redo, redo+1), true
		if len(ws) == 0 {
			return
		}
		tx, err = conn.BeginTx(ctx, nil)
	}
}

// runTx runs ws in tx, each under a savepoint when savepoints is set (else
// the atomic ones without), and ends tx, setting each write's err. When an
// atomic write running without a savepoint failed after it may have
// written, runTx rolls tx back and returns its index; else it returns -1
// and whether tx committed.
func (b *batcher) runTx(ctx context.Context, tx *sql.Tx, ws []*write, savepoints bool) (redo int, committed bool) {
	if b.stmts == nil {
		b.stmts = make(map[*sql.Stmt]*sql.Stmt)
	}
	clear(b.stmts)
	var doomed error // fails the whole batch
	for i, w := range ws {
		sp := len(ws) > 1 && (savepoints || !w.atomic)
		if sp {
			if _, err := tx.ExecContext(ctx, "SAVEPOINT idem_write"); err != nil {
				doomed = err
				break
			}
		}
		ran, err := call(w, tx)
		if w.err = err; err != nil {
			switch {
			case sp:
				if _, err := tx.ExecContext(ctx, "ROLLBACK TO idem_write"); err != nil {
					doomed = err
				}
			case len(ws) == 1:
				w.err = errors.Join(err, rollback(tx))
				return -1, false
			case !ran || errors.Is(err, idemstore.ErrLeaseLost):
				// It wrote nothing.
			default:
				if err := rollback(tx); err != nil {
					doomed = err
				} else {
					return i, false
				}
			}
			if doomed != nil {
				break
			}
		}
		if sp {
			if _, err := tx.ExecContext(ctx, "RELEASE idem_write"); err != nil {
				doomed = err
				break
			}
		}
	}
	if doomed == nil {
		doomed = tx.Commit()
	} else {
		doomed = errors.Join(doomed, rollback(tx))
	}
	if doomed != nil {
		for _, w := range ws {
			if w.err == nil {
				w.err = doomed
			}
		}
		return -1, false
	}
	return -1, true
}
