package idemnats_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemstore"
)

// msgID reads a message's Nats-Msg-Id.
func msgID(m jetstream.Msg) string { return m.Headers().Get(jetstream.MsgIDHeader) }

// eventID reads a message's Event-Id header, the business id some tests
// give Config.MessageID.
func eventID(m jetstream.Msg) string { return m.Headers().Get("Event-Id") }

// TestDuplicateBeyondWindow: a producer publishes a message again after the
// stream's duplicate window, so JetStream stores and delivers it twice; the
// handler runs once and the second copy is acked as replayed. Another id
// runs on its own.
func TestDuplicateBeyondWindow(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", func(c *jetstream.StreamConfig) { c.Duplicates = 100 * time.Millisecond })
	var runs counter
	c := idemnats.New(b.db.store, runs.handler(msgID), config(b.clock, nil))

	first := b.publish(t, "orders", `{"order":1,"cents":500}`, jetstream.MsgIDHeader, "order-1")
	b.publish(t, "orders", `{"order":2,"cents":700}`, jetstream.MsgIDHeader, "order-2")
	// Within the window JetStream drops the copy itself; wait for the
	// window to pass (the server's time, not a lease) until it stores it.
	var again *jetstream.PubAck
	for i := 0; ; i++ {
		again = b.publish(t, "orders", `{"order":1,"cents":500}`, jetstream.MsgIDHeader, "order-1")
		if !again.Duplicate {
			break
		}
		if i == 200 {
			t.Fatal("the stream still deduplicates after 4s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if again.Sequence == first.Sequence {
		t.Fatalf("the copy has the first message's sequence %d", first.Sequence)
	}

	b.process(t, c, idemnats.OutcomeCompleted)
	b.process(t, c, idemnats.OutcomeCompleted)
	m := b.process(t, c, idemnats.OutcomeReplayed)
	if md, _ := m.Metadata(); md.Sequence.Stream != again.Sequence || md.NumDelivered != 1 {
		t.Fatalf("replayed stream message %d (delivery %d), want the copy %d", md.Sequence.Stream, md.NumDelivered, again.Sequence)
	}
	waitSettled(t, b.cons)
	if runs.get("order-1") != 1 || runs.get("order-2") != 1 {
		t.Fatalf("runs: %v; want each id once", runs.n)
	}
	for _, key := range []string{"order-1", "order-2"} {
		if rec := b.record(t, key); rec.State != idemstore.StateCompleted || rec.Attempts != 1 {
			t.Fatalf("record %s: %s after %d attempts; want completed after 1", key, rec.State, rec.Attempts)
		}
	}
}

// TestConcurrentDuplicates: 200 copies of one event (one business id in a
// header, as Config.MessageID reads it) are consumed at once by four
// consumers, each with its own connection and its own goroutine per
// message. The handler runs once, holding its lease until every other copy
// was told the id is in progress; then every copy is acked, 199 of them as
// replays.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const n, consumers = 200, 4
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind, nil)
			for i := range n {
				b.publish(t, "events", `{"event":"evt-1","cents":500}`, "Event-Id", "evt-1", jetstream.MsgIDHeader, fmt.Sprint("publish-", i))
			}

			type result struct {
				o   idemnats.Outcome
				seq uint64
				err error
			}
			results := make(chan result, 4*n)
			release := make(chan struct{})
			var runs atomic.Int64
			handler := func(ctx context.Context, m jetstream.Msg) error {
				runs.Add(1)
				select { // hold the lease until every other copy was refused
				case <-release:
				case <-time.After(60 * time.Second):
					t.Error("the other copies were not all refused while the handler ran")
				}
				return nil
			}
			var wg sync.WaitGroup
			var delivered [consumers]atomic.Int64
			for i := range consumers {
				nc, js := connect(t)
				store := b.db.store
				if kind == "postgres" { // one store per consumer, as in separate processes
					store = openDB(t, b.db.spec, b.clock.Now).store
				}
				cfg := config(b.clock, nil)
				cfg.RetryDelay = 200 * time.Millisecond
				cfg.MessageID = eventID
				c := idemnats.New(store, handler, cfg)
				cons, err := js.Consumer(context.Background(), b.stream, worker)
				if err != nil {
					t.Fatal(err)
				}
				cc, err := cons.Consume(func(m jetstream.Msg) {
					delivered[i].Add(1)
					wg.Add(1)
					go func() {
						defer wg.Done()
						o, err := c.Process(context.Background(), m)
						md, _ := m.Metadata()
						results <- result{o, md.Sequence.Stream, err}
					}()
				}, jetstream.PullMaxMessages(25))
				if err != nil {
					t.Fatalf("consumer %d: %v", i, err)
				}
				t.Cleanup(func() { cc.Stop(); wg.Wait(); nc.Close() })
			}

			refused := map[uint64]bool{}
			acked := map[uint64]idemnats.Outcome{}
			timeout := time.After(90 * time.Second)
			for len(acked) < n {
				select {
				case r := <-results:
					switch r.o {
					case idemnats.OutcomeInProgress:
						if !refused[r.seq] {
							refused[r.seq] = true
							if len(refused) == n-1 {
								close(release)
							}
						}
					case idemnats.OutcomeCompleted, idemnats.OutcomeReplayed:
						if prev, ok := acked[r.seq]; ok {
							t.Errorf("stream message %d acked twice (%s, %s)", r.seq, prev, r.o)
						}
						acked[r.seq] = r.o
					default:
						t.Fatalf("stream message %d: outcome %q (%v)", r.seq, r.o, r.err)
					}
				case <-timeout:
					t.Fatalf("after 90s: %d copies refused, %d acked of %d", len(refused), len(acked), n)
				}
			}
			completed := 0
			for _, o := range acked {
				if o == idemnats.OutcomeCompleted {
					completed++
				}
			}
			if runs.Load() != 1 || completed != 1 {
				t.Fatalf("the handler ran %d times, %d copies completed; want 1 and 1 (and %d replays)", runs.Load(), completed, n-1)
			}
			if rec := b.record(t, "evt-1"); rec.State != idemstore.StateCompleted || rec.Attempts != 1 {
				t.Fatalf("record: %s after %d attempts; want completed after 1", rec.State, rec.Attempts)
			}
			busy := 0
			for i := range delivered {
				if delivered[i].Load() > 0 {
					busy++
				}
			}
			t.Logf("deliveries per consumer: %d %d %d %d", delivered[0].Load(), delivered[1].Load(), delivered[2].Load(), delivered[3].Load())
			if busy < 2 {
				t.Fatalf("only %d of %d consumers got messages", busy, consumers)
			}
		})
	}
}

// TestHandlerError: a handler that fails had no effect: its key is released
// and the message nak'ed, so JetStream redelivers it and it runs again.
func TestHandlerError(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs counter
	c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
		if runs.add(msgID(m)) == 1 {
			return errors.New("downstream refused the connection")
		}
		return nil
	}, config(b.clock, nil))
	b.publish(t, "orders", `{"order":3}`, jetstream.MsgIDHeader, "order-3")

	b.process(t, c, idemnats.OutcomeFailed)
	if rec := b.record(t, "order-3"); rec.State != idemstore.StateReleased {
		t.Fatalf("record after the failure: %s, want released", rec.State)
	}
	m := b.process(t, c, idemnats.OutcomeCompleted)
	if md, _ := m.Metadata(); md.NumDelivered != 2 {
		t.Fatalf("completed on delivery %d, want the redelivery (2)", md.NumDelivered)
	}
	waitSettled(t, b.cons)
	if runs.get("order-3") != 2 {
		t.Fatalf("the handler ran %d times, want 2", runs.get("order-3"))
	}
	if rec := b.record(t, "order-3"); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("record: %s after %d attempts; want completed after 2", rec.State, rec.Attempts)
	}
}

// TestUnknown: a handler says its effect may have happened (MarkUnknown,
// then an error). Every later delivery finds the record unknown and does
// not run the handler. By default the message is nak'ed with HoldDelay: it
// stays un-acked, each delivery is logged as a warning (with a key hash,
// never the key) and counted as DecisionUnknown, and once an operator
// settles the record as released the next delivery runs it. With
// Config.Unknown = Term the message is terminated instead.
func TestUnknown(t *testing.T) {
	t.Parallel()
	t.Run("nak", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "sqlite", nil)
		var runs counter
		var log bytes.Buffer
		var metrics decisions
		cfg := config(b.clock, &log)
		cfg.Guard.Metrics = &metrics
		c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
			if runs.add(msgID(m)) == 1 {
				idem.MarkUnknown(ctx)
				return errors.New("the bank timed out after the charge was sent")
			}
			return nil
		}, cfg)
		b.publish(t, "charges", `{"charge":7}`, jetstream.MsgIDHeader, "charge-7-secret")

		b.process(t, c, idemnats.OutcomeFailed)
		for range 3 {
			b.process(t, c, idemnats.OutcomeUnknown)
		}
		if runs.get("charge-7-secret") != 1 {
			t.Fatalf("the handler ran %d times; an unknown outcome must not run again", runs.get("charge-7-secret"))
		}
		if got := metrics.get(endpoint(b.stream), idem.DecisionUnknown); got != 3 {
			t.Errorf("Metrics counted %d unknown decisions, want 3", got)
		}
		logs := log.String()
		warned := 0
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "outcome=unknown") && strings.Contains(line, endpoint(b.stream)) {
				warned++
			}
		}
		if warned != 3 {
			t.Errorf("%d unknown warnings in the log, want 3:\n%s", warned, logs)
		}
		if strings.Contains(logs, "charge-7-secret") {
			t.Errorf("a message id reached the log:\n%s", logs)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if info, err := b.cons.Info(ctx); err != nil || info.NumAckPending != 1 {
			t.Fatalf("consumer: %+v, %v; want the message still awaiting its ack", info, err)
		}

		// Reconciliation finds the charge was never made: released.
		rec := b.record(t, "charge-7-secret")
		if rec.State != idemstore.StateUnknown {
			t.Fatalf("record: %s, want unknown", rec.State)
		}
		if err := b.db.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: rec.Identity, Token: rec.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
		b.process(t, c, idemnats.OutcomeCompleted)
		waitSettled(t, b.cons)
		if runs.get("charge-7-secret") != 2 {
			t.Fatalf("the handler ran %d times, want 2 (once more after the release)", runs.get("charge-7-secret"))
		}
	})
	t.Run("term", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "sqlite", nil)
		var runs counter
		cfg := config(b.clock, nil)
		cfg.Unknown = idemnats.Term
		c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
			runs.add(msgID(m))
			idem.MarkUnknown(ctx)
			return errors.New("the bank timed out after the charge was sent")
		}, cfg)
		b.publish(t, "charges", `{"charge":8}`, jetstream.MsgIDHeader, "charge-8")

		b.process(t, c, idemnats.OutcomeFailed)
		b.process(t, c, idemnats.OutcomeUnknown)
		waitSettled(t, b.cons) // terminated: nothing awaits an ack
		if runs.get("charge-8") != 1 {
			t.Fatalf("the handler ran %d times, want 1", runs.get("charge-8"))
		}
		if rec := b.record(t, "charge-8"); rec.State != idemstore.StateUnknown {
			t.Fatalf("record: %s, want unknown", rec.State)
		}
	})
}

// TestMissingID: a message without an id is held (nak'ed with HoldDelay,
// redelivered, never run) by default, terminated with MissingID = Term, and
// run without protection with MissingID = RunUnprotected.
func TestMissingID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		action idemnats.Action
		want   idemnats.Outcome
		runs   int
	}{
		{0, idemnats.OutcomeMissingID, 0},
		{idemnats.Term, idemnats.OutcomeMissingID, 0},
		{idemnats.RunUnprotected, idemnats.OutcomeCompleted, 1},
	} {
		name := "default"
		if tc.action != 0 {
			name = tc.action.String()
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "sqlite", nil)
			var runs atomic.Int64
			var metrics decisions
			cfg := config(b.clock, nil)
			cfg.MissingID = tc.action
			cfg.Guard.Metrics = &metrics
			c := idemnats.New(b.db.store, func(context.Context, jetstream.Msg) error {
				runs.Add(1)
				return nil
			}, cfg)
			b.publish(t, "orders", `{"order":4}`)

			b.process(t, c, tc.want)
			if tc.action == 0 {
				m := b.process(t, c, idemnats.OutcomeMissingID)
				if md, _ := m.Metadata(); md.NumDelivered != 2 {
					t.Fatalf("held message came back as delivery %d, want 2", md.NumDelivered)
				}
			} else {
				waitSettled(t, b.cons)
			}
			if runs.Load() != int64(tc.runs) {
				t.Fatalf("the handler ran %d times, want %d", runs.Load(), tc.runs)
			}
			if metrics.get(endpoint(b.stream), idem.DecisionInvalid) == 0 {
				t.Error("Metrics did not count the message without id as invalid")
			}
		})
	}
}

// TestKeyReused: the same id on another message is refused and the message
// terminated, which Metrics counts; the first message's result stands.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs atomic.Int64
	var metrics decisions
	cfg := config(b.clock, nil)
	cfg.Guard.Metrics = &metrics
	cfg.MessageID = eventID
	c := idemnats.New(b.db.store, func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return nil
	}, cfg)
	b.publish(t, "events", `{"cents":500}`, "Event-Id", "evt-9")
	b.publish(t, "events", `{"cents":900}`, "Event-Id", "evt-9")

	b.process(t, c, idemnats.OutcomeCompleted)
	b.process(t, c, idemnats.OutcomeKeyReused)
	waitSettled(t, b.cons)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	if got := metrics.get(endpoint(b.stream), "terminated key_reused"); got != 1 {
		t.Errorf("Metrics counted %d key_reused terminations, want 1", got)
	}
}

// TestStoreUnavailable: with the store down the handler never runs (fail
// closed) and the message is nak'ed with a delay, so it comes back.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs atomic.Int64
	c := idemnats.New(b.db.store, func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return nil
	}, config(b.clock, nil))
	b.publish(t, "orders", `{"order":5}`, jetstream.MsgIDHeader, "order-5")
	b.db.sqlite.Close()

	b.process(t, c, idemnats.OutcomeStoreUnavailable)
	m := b.process(t, c, idemnats.OutcomeStoreUnavailable)
	if md, _ := m.Metadata(); md.NumDelivered != 2 {
		t.Fatalf("delivery %d, want the redelivery (2)", md.NumDelivered)
	}
	if runs.Load() != 0 {
		t.Fatalf("the handler ran %d times with the store down", runs.Load())
	}
}

// TestTransactional: in transactional mode the handler's ledger row and the
// record's completion commit together or not at all. A failing handler's
// row is rolled back with the key released; the redelivery writes the row
// and completes the record in one commit; a replay writes nothing.
func TestTransactional(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind, func(c *jetstream.StreamConfig) { c.Duplicates = 100 * time.Millisecond })
			var runs counter
			cfg := config(b.clock, nil)
			cfg.Guard.Transactional = true
			cfg.MessageID = eventID
			c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
				id := eventID(m)
				if err := b.db.record(ctx, id); err != nil {
					return err
				}
				if runs.add(id) == 1 {
					return errors.New("failing after the write")
				}
				return nil
			}, cfg)
			b.publish(t, "payments", `{"cents":500}`, "Event-Id", "pay-1")

			b.process(t, c, idemnats.OutcomeFailed)
			if n := b.db.rows(t); n != 0 {
				t.Fatalf("%d ledger rows after the failed attempt, want 0 (rolled back)", n)
			}
			if rec := b.record(t, "pay-1"); rec.State != idemstore.StateReleased {
				t.Fatalf("record after the failure: %s, want released", rec.State)
			}
			b.process(t, c, idemnats.OutcomeCompleted)
			if n := b.db.rows(t); n != 1 {
				t.Fatalf("%d ledger rows after the completion, want 1", n)
			}
			if rec := b.record(t, "pay-1"); rec.State != idemstore.StateCompleted {
				t.Fatalf("record: %s, want completed", rec.State)
			}
			b.publish(t, "payments", `{"cents":500}`, "Event-Id", "pay-1")
			b.process(t, c, idemnats.OutcomeReplayed)
			waitSettled(t, b.cons)
			if n, r := b.db.rows(t), runs.get("pay-1"); n != 1 || r != 2 {
				t.Fatalf("%d ledger rows, %d runs; want 1 and 2", n, r)
			}
		})
	}
}

// TestHandle: Handle plugs into jetstream.Consumer.Consume; two copies of
// one event and another event run the handler once per event and are all
// acked.
func TestHandle(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs counter
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	c := idemnats.New(b.db.store, runs.handler(eventID), cfg)
	b.publish(t, "events", `{"cents":500}`, "Event-Id", "evt-a")
	b.publish(t, "events", `{"cents":500}`, "Event-Id", "evt-a")
	b.publish(t, "events", `{"cents":700}`, "Event-Id", "evt-b")

	cc, err := b.cons.Consume(c.Handle)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Stop()
	waitSettled(t, b.cons)
	if runs.get("evt-a") != 1 || runs.get("evt-b") != 1 {
		t.Fatalf("runs: %v; want each event once", runs.n)
	}
}

// failingComplete is a real store whose completions fail, as when the
// store goes down while the handler runs.
type failingComplete struct{ idemstore.Store }

func (failingComplete) KeyComplete(context.Context, *idemstore.CompleteParams) error {
	return errors.New("connection reset by peer")
}

// TestNotRecorded: the handler ran but its completion could not be
// written. The message is not acked; the redelivery finds the record in
// progress while the lease lasts, then unknown, and never runs the handler
// again.
func TestNotRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs atomic.Int64
	c := idemnats.New(failingComplete{b.db.store}, func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return nil
	}, config(b.clock, nil))
	b.publish(t, "orders", `{"order":6}`, jetstream.MsgIDHeader, "order-6")

	b.process(t, c, idemnats.OutcomeNotRecorded)
	b.process(t, c, idemnats.OutcomeInProgress)
	b.clock.Advance(31 * time.Second)
	b.process(t, c, idemnats.OutcomeUnknown)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
}

// TestAnyID: ids the core would refuse as keys (too long, not printable
// ASCII) are hashed into one, and still run once.
func TestAnyID(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs counter
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	c := idemnats.New(b.db.store, runs.handler(eventID), cfg)
	ids := []string{strings.Repeat("x", 300), "commande-reçue-7", "ok-id"}
	for _, id := range ids {
		b.publish(t, "events", `{"cents":1}`, "Event-Id", id)
		b.publish(t, "events", `{"cents":1}`, "Event-Id", id)
	}
	for range ids {
		b.process(t, c, idemnats.OutcomeCompleted)
		b.process(t, c, idemnats.OutcomeReplayed)
	}
	for _, id := range ids {
		if runs.get(id) != 1 {
			t.Errorf("id of %d bytes ran %d times, want 1", len(id), runs.get(id))
		}
	}
	recs, err := b.db.store.KeyList(context.Background(), &idemstore.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	hashed := 0
	for _, r := range recs {
		if strings.HasPrefix(r.Key, "sha256:") && len(r.Key) == len("sha256:")+64 {
			hashed++
		}
	}
	if len(recs) != 3 || hashed != 2 {
		t.Fatalf("%d records, %d with hashed keys; want 3 and 2", len(recs), hashed)
	}
}
