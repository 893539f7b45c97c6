package idemamqp_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemstore"
)

// msgID reads a message's message-id property.
func msgID(d *amqp.Delivery) string { return d.MessageId }

// eventID reads a message's Event-Id header, the business id some tests
// give Config.MessageID.
var eventID = idemamqp.Header("Event-Id")

// withID returns properties with the message-id id.
func withID(id string) amqp.Publishing { return amqp.Publishing{MessageId: id} }

// withEvent returns properties with the Event-Id header id.
func withEvent(id string) amqp.Publishing {
	return amqp.Publishing{Headers: amqp.Table{"Event-Id": id}}
}

// TestRedelivery: a message processed and acked, and a copy of it
// published again (a producer that retried a publish whose confirm it
// missed), run the handler once: the copy is acked as replayed. Another id
// runs on its own.
func TestRedelivery(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	c := b.newConsumer(t, b.db.store, runs.handler(msgID), config(b.clock, nil))

	b.publish(t, `{"order":1,"cents":500}`, withID("order-1"))
	b.publish(t, `{"order":2,"cents":700}`, withID("order-2"))
	b.publish(t, `{"order":1,"cents":500}`, withID("order-1"))

	b.process(t, c, idemamqp.OutcomeCompleted)
	b.process(t, c, idemamqp.OutcomeCompleted)
	b.process(t, c, idemamqp.OutcomeReplayed)
	b.settled(t)
	if runs.get("order-1") != 1 || runs.get("order-2") != 1 {
		t.Fatalf("runs: %v; want each id once", runs.n)
	}
	for _, key := range []string{"order-1", "order-2"} {
		if rec := b.record(t, key); rec.State != idemstore.StateCompleted || rec.Attempts != 1 {
			t.Fatalf("record %s: %s after %d attempts; want completed after 1", key, rec.State, rec.Attempts)
		}
	}
}

// TestDuplicateAfterExpiry documents where the promise ends: a copy
// published after the record's retention (idem.Config.TTL) finds no record
// and runs the handler a second time, as a new message. Within the
// retention the same copy is replayed. Keep the retention longer than any
// producer may republish, or let the effect refuse a second copy.
func TestDuplicateAfterExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	cfg := config(b.clock, nil)
	cfg.Guard.TTL = time.Hour
	c := b.newConsumer(t, b.db.store, runs.handler(msgID), cfg)

	b.publish(t, `{"order":3}`, withID("order-3"))
	b.process(t, c, idemamqp.OutcomeCompleted)
	b.clock.Advance(59 * time.Minute)
	b.publish(t, `{"order":3}`, withID("order-3"))
	b.process(t, c, idemamqp.OutcomeReplayed)
	if runs.get("order-3") != 1 {
		t.Fatalf("within the retention: the handler ran %d times, want once", runs.get("order-3"))
	}

	b.clock.Advance(2 * time.Minute) // past expires_at: the record is gone
	b.publish(t, `{"order":3}`, withID("order-3"))
	b.process(t, c, idemamqp.OutcomeCompleted)
	b.settled(t)
	if runs.get("order-3") != 2 {
		t.Fatalf("after the retention: the handler ran %d times; the documented behaviour is twice", runs.get("order-3"))
	}
}

// TestConcurrentDuplicates: 200 copies of one event (one business id in a
// header, as Config.MessageID reads it) are consumed at once by four
// consumers, each with its own connection, channel (prefetch 25) and store
// handle, and its own goroutine per message. The handler runs once,
// holding its lease until every other copy was refused as in progress,
// each refusal sending the copy through the delay queue without holding
// the channel; then every copy is acked, 199 of them as replays.
func TestConcurrentDuplicates(t *testing.T) {
	t.Parallel()
	const n, consumers = 200, 4
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			b := setup(t, kind, 0)
			for i := range n {
				b.publish(t, `{"event":"evt-1","cents":500}`, amqp.Publishing{
					MessageId: fmt.Sprint("publish-", i),
					Headers:   amqp.Table{"Event-Id": "evt-1"},
				})
			}

			type result struct {
				o    idemamqp.Outcome
				copy string
				err  error
			}
			results := make(chan result, 8*n)
			release := make(chan struct{})
			var runs atomic.Int64
			handler := func(ctx context.Context, d *amqp.Delivery) error {
				runs.Add(1)
				select { // hold the lease until every other copy was refused
				case <-release:
				case <-time.After(60 * time.Second):
					t.Error("the other copies were not all refused while the handler ran")
				}
				return nil
			}
			var delivered [consumers]atomic.Int64
			for i := range consumers {
				var wg sync.WaitGroup
				conn := connect(t)
				store := b.db.store
				if kind == "postgres" { // one store per consumer, as in separate processes
					store = openDB(t, b.db.spec, b.clock.Now).store
				}
				cfg := config(b.clock, nil)
				cfg.RetryDelay = 200 * time.Millisecond
				cfg.MessageID = eventID
				c := idemamqp.New(conn, b.queue, store, handler, cfg)
				ch, err := conn.Channel()
				if err != nil {
					t.Fatal(err)
				}
				if err := ch.Qos(25, 0, false); err != nil {
					t.Fatal(err)
				}
				ds, err := ch.Consume(b.queue, "", false, false, false, false, nil)
				if err != nil {
					t.Fatalf("consumer %d: %v", i, err)
				}
				wg.Go(func() {
					for d := range ds {
						delivered[i].Add(1)
						wg.Go(func() {
							o, err := c.Process(context.Background(), &d)
							results <- result{o, d.MessageId, err}
						})
					}
				})
				t.Cleanup(func() { ch.Close(); wg.Wait(); c.Close() })
			}

			refused := map[string]bool{}
			acked := map[string]idemamqp.Outcome{}
			timeout := time.After(90 * time.Second)
			for len(acked) < n {
				select {
				case r := <-results:
					switch r.o {
					case idemamqp.OutcomeInProgress:
						if r.err != nil && !errors.As(r.err, new(*idem.Error)) {
							t.Fatalf("copy %s: in progress, but settling failed: %v", r.copy, r.err)
						}
						if !refused[r.copy] {
							refused[r.copy] = true
							if len(refused) == n-1 {
								close(release)
							}
						}
					case idemamqp.OutcomeCompleted, idemamqp.OutcomeReplayed:
						if prev, ok := acked[r.copy]; ok {
							t.Errorf("copy %s acked twice (%s, %s)", r.copy, prev, r.o)
						}
						acked[r.copy] = r.o
					default:
						t.Fatalf("copy %s: outcome %q (%v)", r.copy, r.o, r.err)
					}
				case <-timeout:
					t.Fatalf("after 90s: %d copies refused, %d acked of %d", len(refused), len(acked), n)
				}
			}
			completed := 0
			for _, o := range acked {
				if o == idemamqp.OutcomeCompleted {
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
			if work, delay := count(t, b.conn, b.queue), count(t, b.conn, b.queue+".delay"); work != 0 || delay != 0 {
				t.Fatalf("%d messages left in the work queue, %d in the delay queue", work, delay)
			}
		})
	}
}

// TestHandlerError: a handler that fails had no effect: its key is released
// and the message requeued, so it runs again.
func TestHandlerError(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	c := b.newConsumer(t, b.db.store, func(ctx context.Context, d *amqp.Delivery) error {
		if runs.add(msgID(d)) == 1 {
			return errors.New("downstream refused the connection")
		}
		return nil
	}, config(b.clock, nil))
	b.publish(t, `{"order":3}`, withID("order-3"))

	b.process(t, c, idemamqp.OutcomeFailed)
	if rec := b.record(t, "order-3"); rec.State != idemstore.StateReleased {
		t.Fatalf("record after the failure: %s, want released", rec.State)
	}
	d := b.process(t, c, idemamqp.OutcomeCompleted)
	if !d.Redelivered {
		t.Fatal("completed on the first delivery, want the redelivery")
	}
	b.settled(t)
	if runs.get("order-3") != 2 {
		t.Fatalf("the handler ran %d times, want 2", runs.get("order-3"))
	}
	if rec := b.record(t, "order-3"); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
		t.Fatalf("record: %s after %d attempts; want completed after 2", rec.State, rec.Attempts)
	}
}

// TestPoison: a message whose handler always fails is requeued until the
// quorum queue's delivery limit, then dead-lettered by the broker with the
// x-death reason delivery_limit: never dropped. Delivery limit 2: three
// deliveries.
func TestPoison(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 2)
	var runs atomic.Int64
	cfg := config(b.clock, nil)
	cfg.DeliveryLimit = 2
	c := b.newConsumer(t, b.db.store, func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return errors.New("cannot parse the message")
	}, cfg)
	b.publish(t, `{"order":`, withID("poison-1"))

	for range 3 {
		b.process(t, c, idemamqp.OutcomeFailed)
	}
	d := deadLetter(t, b.conn, b.queue)
	if d.MessageId != "poison-1" || deathReason(d) != "delivery_limit" {
		t.Fatalf("dead letter %q with x-death reason %q; want poison-1, delivery_limit", d.MessageId, deathReason(d))
	}
	b.settled(t)
	if runs.Load() != 3 {
		t.Fatalf("the handler ran %d times, want 3", runs.Load())
	}
}

// TestDeliveryLimitAcrossCopies: the broker's x-delivery-count starts again
// on a copy back from the delay queue, so the Consumer carries the returns
// so far in x-idem-returns and dead-letters, with x-idem-outcome
// delivery_limit, a message returned more often than Config.DeliveryLimit
// in all. A failed delivery (one return) whose copy went through the delay
// queue (its id in progress elsewhere) arrives with x-idem-returns 1.
func TestDeliveryLimitAcrossCopies(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	cfg := config(b.clock, nil)
	cfg.DeliveryLimit = 3
	c := b.newConsumer(t, b.db.store, func(_ context.Context, d *amqp.Delivery) error {
		runs.add(msgID(d))
		return errors.New("the downstream refused")
	}, cfg)

	// A failed delivery, then its id in progress (another consumer's
	// lease): the copy keeps the count.
	body := `{"order":7}`
	b.publish(t, body, withID("order-7"))
	b.process(t, c, idemamqp.OutcomeFailed)
	if _, err := b.db.store.KeyReserve(context.Background(), &idemstore.ReserveParams{
		Identity:    idemstore.Identity{Endpoint: endpoint(b.queue), Key: "order-7"},
		Fingerprint: idem.FingerprintBytes(b.queue, []byte(body)),
		Token:       "another-consumer", Lease: time.Minute, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown,
	}); err != nil {
		t.Fatal(err)
	}
	b.process(t, c, idemamqp.OutcomeInProgress)
	d := b.cons.next(t)
	if got := d.Headers[idemamqp.HeaderReturns]; got != int64(1) || d.Headers["x-delivery-count"] != nil {
		t.Fatalf("the copy's %s: %v (%T), x-delivery-count %v; want 1 and none", idemamqp.HeaderReturns, got, got, d.Headers["x-delivery-count"])
	}
	d.Ack(false)

	// A message whose copies were returned three times before, returned
	// once more: four returns, over the limit.
	b.publish(t, `{"order":8}`, amqp.Publishing{MessageId: "order-8", Headers: amqp.Table{idemamqp.HeaderReturns: int64(3)}})
	d = b.cons.next(t)
	d.Nack(false, true)
	b.process(t, c, idemamqp.OutcomeDeliveryLimit)
	dead := deadLetter(t, b.conn, b.queue)
	if dead.MessageId != "order-8" || dead.Headers[idemamqp.HeaderOutcome] != "delivery_limit" {
		t.Fatalf("dead letter %q with %s %v; want order-8, delivery_limit", dead.MessageId, idemamqp.HeaderOutcome, dead.Headers[idemamqp.HeaderOutcome])
	}
	b.settled(t)
	if runs.get("order-7") != 1 || runs.get("order-8") != 0 {
		t.Fatalf("runs %v; want order-7 once (the failure), order-8 never", runs.n)
	}
}

// TestUnknown: a handler says its effect may have happened (MarkUnknown,
// then an error). Every later delivery finds the record unknown and does
// not run the handler. By default the message is held: copied to the delay
// queue with HoldDelay and acked, back again and again; each delivery is
// logged as a warning (with a key hash, never the key, and the holds so
// far) and counted as DecisionUnknown; once an operator settles the record
// as released the next delivery runs it. With Config.Unknown = DeadLetter
// it goes to the dead-letter queue with x-idem-outcome unknown instead.
func TestUnknown(t *testing.T) {
	t.Parallel()
	t.Run("hold", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "sqlite", 0)
		var runs counter
		var log bytes.Buffer
		var metrics decisions
		cfg := config(b.clock, &log)
		cfg.Guard.Metrics = &metrics
		c := b.newConsumer(t, b.db.store, func(ctx context.Context, d *amqp.Delivery) error {
			if runs.add(msgID(d)) == 1 {
				idem.MarkUnknown(ctx)
				return errors.New("the bank timed out after the charge was sent")
			}
			return nil
		}, cfg)
		b.publish(t, `{"charge":7}`, withID("charge-7-secret"))

		b.process(t, c, idemamqp.OutcomeFailed)
		for range 3 {
			b.process(t, c, idemamqp.OutcomeUnknown)
		}
		if runs.get("charge-7-secret") != 1 {
			t.Fatalf("the handler ran %d times; an unknown outcome must not run again", runs.get("charge-7-secret"))
		}
		if got := metrics.get(endpoint(b.queue), idem.DecisionUnknown); got != 3 {
			t.Errorf("Metrics counted %d unknown decisions, want 3", got)
		}
		logs := log.String()
		var holds []string
		for _, line := range strings.Split(logs, "\n") {
			if strings.Contains(line, "level=WARN") && strings.Contains(line, "outcome=unknown") && strings.Contains(line, endpoint(b.queue)) {
				_, h, _ := strings.Cut(line, " holds=")
				h, _, _ = strings.Cut(h, " ")
				holds = append(holds, h)
			}
		}
		if strings.Join(holds, ",") != "0,1,2" {
			t.Errorf("unknown warnings with holds %v, want 3 warnings with 0,1,2:\n%s", holds, logs)
		}
		if strings.Contains(logs, "charge-7-secret") {
			t.Errorf("a message id reached the log:\n%s", logs)
		}

		// Reconciliation finds the charge was never made: released.
		rec := b.record(t, "charge-7-secret")
		if rec.State != idemstore.StateUnknown {
			t.Fatalf("record: %s, want unknown", rec.State)
		}
		ctx := context.Background()
		if err := b.db.store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: rec.Identity, Token: rec.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
		b.process(t, c, idemamqp.OutcomeCompleted)
		b.settled(t)
		if runs.get("charge-7-secret") != 2 {
			t.Fatalf("the handler ran %d times, want 2 (once more after the release)", runs.get("charge-7-secret"))
		}
	})
	t.Run("dead_letter", func(t *testing.T) {
		t.Parallel()
		b := setup(t, "sqlite", 0)
		var runs counter
		cfg := config(b.clock, nil)
		cfg.Unknown = idemamqp.DeadLetter
		c := b.newConsumer(t, b.db.store, func(ctx context.Context, d *amqp.Delivery) error {
			runs.add(msgID(d))
			idem.MarkUnknown(ctx)
			return errors.New("the bank timed out after the charge was sent")
		}, cfg)
		b.publish(t, `{"charge":8}`, withID("charge-8"))

		b.process(t, c, idemamqp.OutcomeFailed)
		b.process(t, c, idemamqp.OutcomeUnknown)
		d := deadLetter(t, b.conn, b.queue)
		if d.MessageId != "charge-8" || d.Headers[idemamqp.HeaderOutcome] != "unknown" || string(d.Body) != `{"charge":8}` {
			t.Fatalf("dead letter %q %s with %s %v; want charge-8 with unknown", d.MessageId, d.Body, idemamqp.HeaderOutcome, d.Headers[idemamqp.HeaderOutcome])
		}
		b.settled(t)
		if runs.get("charge-8") != 1 {
			t.Fatalf("the handler ran %d times, want 1", runs.get("charge-8"))
		}
		if rec := b.record(t, "charge-8"); rec.State != idemstore.StateUnknown {
			t.Fatalf("record: %s, want unknown", rec.State)
		}
	})
}

// TestMissingID: a message without an id is held (through the delay queue,
// back again, never run) by default, dead-lettered with MissingID =
// DeadLetter, and run without protection with MissingID = RunUnprotected.
func TestMissingID(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		action idemamqp.Action
		want   idemamqp.Outcome
		runs   int
	}{
		{0, idemamqp.OutcomeMissingID, 0},
		{idemamqp.DeadLetter, idemamqp.OutcomeMissingID, 0},
		{idemamqp.RunUnprotected, idemamqp.OutcomeCompleted, 1},
	} {
		name := "default"
		if tc.action != 0 {
			name = tc.action.String()
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "sqlite", 0)
			var runs atomic.Int64
			var metrics decisions
			cfg := config(b.clock, nil)
			cfg.MissingID = tc.action
			cfg.Guard.Metrics = &metrics
			c := b.newConsumer(t, b.db.store, func(context.Context, *amqp.Delivery) error {
				runs.Add(1)
				return nil
			}, cfg)
			b.publish(t, `{"order":4}`, amqp.Publishing{})

			b.process(t, c, tc.want)
			switch tc.action {
			case 0:
				d := b.process(t, c, idemamqp.OutcomeMissingID)
				if d.Headers["x-death"] == nil {
					t.Fatalf("the held message came back without x-death: %v", d.Headers)
				}
			case idemamqp.DeadLetter:
				if d := deadLetter(t, b.conn, b.queue); d.Headers[idemamqp.HeaderOutcome] != "missing_id" {
					t.Fatalf("dead letter with %s %v, want missing_id", idemamqp.HeaderOutcome, d.Headers[idemamqp.HeaderOutcome])
				}
				b.settled(t)
			default:
				b.settled(t)
			}
			if runs.Load() != int64(tc.runs) {
				t.Fatalf("the handler ran %d times, want %d", runs.Load(), tc.runs)
			}
			if metrics.get(endpoint(b.queue), idem.DecisionInvalid) == 0 {
				t.Error("Metrics did not count the message without id as invalid")
			}
		})
	}
}

// TestKeyReused: the same id on another message is refused and the message
// dead-lettered with x-idem-outcome key_reused; the first message's result
// stands.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs atomic.Int64
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	c := b.newConsumer(t, b.db.store, func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return nil
	}, cfg)
	b.publish(t, `{"cents":500}`, withEvent("evt-9"))
	b.publish(t, `{"cents":900}`, withEvent("evt-9"))

	b.process(t, c, idemamqp.OutcomeCompleted)
	b.process(t, c, idemamqp.OutcomeKeyReused)
	if d := deadLetter(t, b.conn, b.queue); string(d.Body) != `{"cents":900}` || d.Headers[idemamqp.HeaderOutcome] != "key_reused" {
		t.Fatalf("dead letter %s with %s %v; want the second message, key_reused", d.Body, idemamqp.HeaderOutcome, d.Headers[idemamqp.HeaderOutcome])
	}
	b.settled(t)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
}

// TestStoreUnavailable: with the store down the handler never runs (fail
// closed) and the message goes through the delay queue, so it comes back.
func TestStoreUnavailable(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs atomic.Int64
	c := b.newConsumer(t, b.db.store, func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return nil
	}, config(b.clock, nil))
	b.publish(t, `{"order":5}`, withID("order-5"))
	b.db.sqlite.Close()

	b.process(t, c, idemamqp.OutcomeStoreUnavailable)
	d := b.process(t, c, idemamqp.OutcomeStoreUnavailable)
	if d.Headers["x-death"] == nil || d.Headers[idemamqp.HeaderRoutingKey] != b.queue {
		t.Fatalf("the second delivery is not the copy back from the delay queue: %v", d.Headers)
	}
	if runs.Load() != 0 {
		t.Fatalf("the handler ran %d times with the store down", runs.Load())
	}
}

// TestDelayQueueMissing: a copy that no queue takes (the delay queue was
// deleted) is returned by the broker; the original is then requeued, not
// acked, so nothing is lost.
func TestDelayQueueMissing(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	c := b.newConsumer(t, b.db.store, func(context.Context, *amqp.Delivery) error { return nil }, config(b.clock, nil))
	ch, err := b.conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDelete(b.queue+".delay", false, false, false); err != nil {
		t.Fatal(err)
	}
	ch.Close()
	b.publish(t, `{"order":6}`, withID("order-6"))
	b.db.sqlite.Close()

	d := b.cons.next(t)
	o, err := c.Process(context.Background(), d)
	if o != idemamqp.OutcomeStoreUnavailable || err == nil || !strings.Contains(err.Error(), "no queue took") {
		t.Fatalf("outcome %q, error %v; want store_unavailable and the returned copy", o, err)
	}
	d = b.cons.next(t)
	if d.MessageId != "order-6" || !d.Redelivered {
		t.Fatalf("next delivery %q (redelivered %v), want order-6 requeued", d.MessageId, d.Redelivered)
	}
	// Declare the delay queue again for the cleanup.
	declare(t, b.conn, b.queue, 0)
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
			b := setup(t, kind, 0)
			var runs counter
			cfg := config(b.clock, nil)
			cfg.Guard.Transactional = true
			cfg.MessageID = eventID
			c := b.newConsumer(t, b.db.store, func(ctx context.Context, d *amqp.Delivery) error {
				id := eventID(d)
				if err := b.db.record(ctx, id); err != nil {
					return err
				}
				if runs.add(id) == 1 {
					return errors.New("failing after the write")
				}
				return nil
			}, cfg)
			b.publish(t, `{"cents":500}`, withEvent("pay-1"))

			b.process(t, c, idemamqp.OutcomeFailed)
			if n := b.db.rows(t); n != 0 {
				t.Fatalf("%d ledger rows after the failed attempt, want 0 (rolled back)", n)
			}
			if rec := b.record(t, "pay-1"); rec.State != idemstore.StateReleased {
				t.Fatalf("record after the failure: %s, want released", rec.State)
			}
			b.process(t, c, idemamqp.OutcomeCompleted)
			if n := b.db.rows(t); n != 1 {
				t.Fatalf("%d ledger rows after the completion, want 1", n)
			}
			if rec := b.record(t, "pay-1"); rec.State != idemstore.StateCompleted {
				t.Fatalf("record: %s, want completed", rec.State)
			}
			b.publish(t, `{"cents":500}`, withEvent("pay-1"))
			b.process(t, c, idemamqp.OutcomeReplayed)
			b.settled(t)
			if n, r := b.db.rows(t), runs.get("pay-1"); n != 1 || r != 2 {
				t.Fatalf("%d ledger rows, %d runs; want 1 and 2", n, r)
			}
		})
	}
}

// TestRun: Run consumes the queue with a goroutine per message; two copies
// of one event and another event run the handler once per event, all are
// acked, and Run returns nil once its context ends.
func TestRun(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	done := make(chan struct{}, 3)
	cfg := config(b.clock, nil)
	logs := &syncWriter{w: new(bytes.Buffer)}
	cfg.Guard.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg.MessageID = eventID
	c := b.newConsumer(t, b.db.store, func(ctx context.Context, d *amqp.Delivery) error {
		runs.add(eventID(d))
		done <- struct{}{}
		return nil
	}, cfg)
	b.publish(t, `{"cents":500}`, withEvent("evt-a"))
	b.publish(t, `{"cents":500}`, withEvent("evt-a"))
	b.publish(t, `{"cents":700}`, withEvent("evt-b"))

	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- c.Run(ctx) }()
	for range 2 {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("the events did not run within 30s")
		}
	}
	// The copy of evt-a comes back from the delay queue if it arrived
	// while the first ran; wait until all three messages are settled: two
	// completed, the later evt-a replayed (each logged once acked). Empty
	// queues do not tell it: a message back from the delay queue and
	// delivered, but not yet taken by Run, is in neither count, and Run's
	// end requeues it.
	deadline := time.Now().Add(30 * time.Second)
	for {
		l := logs.String()
		if strings.Count(l, "outcome=completed") == 2 && strings.Count(l, "outcome=replayed") == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("messages not settled after 30s; log:\n%s", l)
		}
		time.Sleep(20 * time.Millisecond) // polling the consumer's log
	}
	cancel()
	if err := <-ran; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if work := count(t, b.conn, b.queue); work != 0 {
		t.Fatalf("%d messages back in the queue after Run: all should have been acked", work)
	}
	if delayed := count(t, b.conn, b.queue+".delay"); delayed != 0 {
		t.Fatalf("%d messages in the delay queue after Run: all should have been settled", delayed)
	}
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
// written. The message goes through the delay queue, never acked as done;
// the copy finds the record in progress while the lease lasts, then
// unknown, and never runs the handler again.
func TestNotRecorded(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs atomic.Int64
	c := b.newConsumer(t, failingComplete{b.db.store}, func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return nil
	}, config(b.clock, nil))
	b.publish(t, `{"order":6}`, withID("order-6"))

	b.process(t, c, idemamqp.OutcomeNotRecorded)
	b.process(t, c, idemamqp.OutcomeInProgress)
	b.clock.Advance(31 * time.Second)
	b.process(t, c, idemamqp.OutcomeUnknown)
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
}

// TestAnyID: ids the core would refuse as keys (too long, not printable
// ASCII) are hashed into one, and still run once.
func TestAnyID(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs counter
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	c := b.newConsumer(t, b.db.store, runs.handler(eventID), cfg)
	ids := []string{strings.Repeat("x", 300), "commande-reçue-7", "ok-id"}
	for _, id := range ids {
		b.publish(t, `{"cents":1}`, withEvent(id))
		b.publish(t, `{"cents":1}`, withEvent(id))
	}
	for range ids {
		b.process(t, c, idemamqp.OutcomeCompleted)
		b.process(t, c, idemamqp.OutcomeReplayed)
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

func TestAtLeast310(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]bool{"3.10.8": true, "3.13.0": true, "4.0.2": true, "3.9.29": false, "3.8.0": false, "": true} {
		if got := idemamqp.AtLeast310(v); got != want {
			t.Errorf("%q: %v, want %v", v, got, want)
		}
	}
}
