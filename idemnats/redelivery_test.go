package idemnats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemprom"
)

// deliveries records when a handler ran, one entry per delivery.
type deliveries struct {
	mu sync.Mutex
	at []time.Time
}

func (d *deliveries) add() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.at = append(d.at, time.Now())
}

func (d *deliveries) list() []time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]time.Time(nil), d.at...)
}

// poison is a handler that always fails, counting its runs in d.
func (d *deliveries) poison(context.Context, jetstream.Msg) error {
	d.add()
	return errors.New("downstream refused the message")
}

// TestPoisonMessageBacksOff: a handler that always fails, with the default
// ErrorDelay and an unlimited MaxDeliver, as the documentation recommends,
// is redelivered with delays that grow with each delivery (one second,
// doubling, with jitter down to half), not at once: over 2.5 s of wall
// time it runs two or three times, where a plain nak ran it hundreds of
// times, each with two store writes.
func TestPoisonMessageBacksOff(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var d deliveries
	cfg := config(b.clock, nil)
	cfg.ErrorDelay = 0 // the default
	c := idemnats.New(b.db.store, d.poison, cfg)
	b.publish(t, "orders", `{"order":13}`, jetstream.MsgIDHeader, "order-13")
	cc, err := b.cons.Consume(c.Handle)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2500 * time.Millisecond) // the window JetStream redelivers in
	cc.Stop()
	at := d.list()
	if len(at) < 2 || len(at) > 4 {
		t.Fatalf("the failing message ran %d times in 2.5 s, want 2 to 4 (a backoff from 1 s)", len(at))
	}
	for i := 1; i < len(at); i++ {
		// Delivery i failed; its delay was 2^(i-1) s, jittered down to half.
		if gap, least := at[i].Sub(at[i-1]), time.Duration(1<<(i-1))*time.Second/2; gap < least {
			t.Errorf("delivery %d came %v after delivery %d, want at least %v", i+1, gap, i, least)
		}
	}
}

// limitedConsumer returns the stream's durable consumer "worker" with
// MaxDeliver maxDeliver, and a channel that receives the consumer's
// MSG_TERMINATED advisories.
func limitedConsumer(t *testing.T, b *bundle, maxDeliver int) (jetstream.Consumer, <-chan *nats.Msg) {
	return reconfigure(t, b, 30*time.Second, maxDeliver)
}

// reconfigure updates the stream's durable consumer "worker" to ackWait
// and maxDeliver, and returns it with a channel that receives its
// MSG_TERMINATED advisories.
func reconfigure(t *testing.T, b *bundle, ackWait time.Duration, maxDeliver int) (jetstream.Consumer, <-chan *nats.Msg) {
	t.Helper()
	nc, _ := connect(t)
	advisories := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED."+b.stream+"."+worker, advisories)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := b.js.CreateOrUpdateConsumer(ctx, b.stream, jetstream.ConsumerConfig{
		Durable:    worker,
		AckPolicy:  jetstream.AckExplicitPolicy,
		AckWait:    ackWait,
		MaxDeliver: maxDeliver,
	})
	if err != nil {
		t.Fatal(err)
	}
	return cons, advisories
}

// readsTermReason reports whether a nats-server of version reads a
// termination's reason (2.10.4 and later).
func readsTermReason(t *testing.T, version string) bool {
	t.Helper()
	var v [3]int
	if _, err := fmt.Sscanf(strings.TrimPrefix(version, "v"), "%d.%d.%d", &v[0], &v[1], &v[2]); err != nil {
		t.Fatalf("server version %q: %v", version, err)
	}
	return v[0] > 2 || v[0] == 2 && (v[1] > 10 || v[1] == 10 && v[2] >= 4)
}

// TestLastDelivery: on the last delivery the consumer's MaxDeliver allows,
// a message that would be nak'ed (its handler failed, or it is held as
// unknown) is terminated instead, logged as an error and counted, so that
// JetStream does not drop it silently; JetStream publishes its
// MSG_TERMINATED advisory.
func TestLastDelivery(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		unknown bool // the first run marks the outcome unknown: held after
		before  idemnats.Outcome
		conn    bool // Config.Conn is set: the reason goes with the term where the server reads it
	}{
		{"failing handler", false, idemnats.OutcomeFailed, false},
		{"held unknown", true, idemnats.OutcomeUnknown, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, "sqlite", nil)
			const maxDeliver = 3
			cons, advisories := limitedConsumer(t, b, maxDeliver)
			var log bytes.Buffer
			var metrics decisions
			cfg := config(b.clock, &log)
			cfg.Guard.Metrics = &metrics
			cfg.MaxDeliver = maxDeliver
			wantReason := false
			if tc.conn {
				nc, _ := connect(t)
				cfg.Conn = nc
				wantReason = readsTermReason(t, nc.ConnectedServerVersion())
			}
			var runs atomic.Int64
			c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
				runs.Add(1)
				if tc.unknown {
					idem.MarkUnknown(ctx)
				}
				return errors.New("downstream refused the message")
			}, cfg)
			ack := b.publish(t, "orders", `{"order":21}`, jetstream.MsgIDHeader, "order-21")

			process(t, c, cons, idemnats.OutcomeFailed)
			process(t, c, cons, tc.before)
			m := process(t, c, cons, idemnats.OutcomeMaxDeliveries)
			if md, _ := m.Metadata(); md.NumDelivered != maxDeliver {
				t.Fatalf("terminated on delivery %d, want %d", md.NumDelivered, maxDeliver)
			}
			waitSettled(t, cons)
			select {
			case adv := <-advisories:
				var a struct {
					StreamSeq  uint64 `json:"stream_seq"`
					Deliveries uint64 `json:"deliveries"`
					Reason     string `json:"reason"`
				}
				if err := json.Unmarshal(adv.Data, &a); err != nil {
					t.Fatal(err)
				}
				t.Logf("advisory: %s", adv.Data)
				if a.StreamSeq != ack.Sequence || a.Deliveries != maxDeliver {
					t.Errorf("advisory %s, want stream message %d terminated on delivery %d", adv.Data, ack.Sequence, maxDeliver)
				}
				if (wantReason || a.Reason != "") && !strings.Contains(a.Reason, "MaxDeliver") {
					t.Errorf("advisory reason %q, want one naming MaxDeliver", a.Reason)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("no MSG_TERMINATED advisory: the message was not terminated")
			}
			wantRuns := int64(maxDeliver)
			if tc.unknown {
				wantRuns = 1
			}
			if runs.Load() != wantRuns {
				t.Errorf("the handler ran %d times, want %d", runs.Load(), wantRuns)
			}
			if got := metrics.get(endpoint(b.stream), "terminated max_deliveries"); got != 1 {
				t.Errorf("Metrics counted %d terminations on the last delivery, want 1", got)
			}
			logged := 0
			for _, line := range strings.Split(log.String(), "\n") {
				if strings.Contains(line, "level=ERROR") && strings.Contains(line, "outcome=max_deliveries") && strings.Contains(line, "num_delivered=3") {
					logged++
				}
			}
			if logged != 1 {
				t.Errorf("%d error lines for the last delivery, want 1:\n%s", logged, log.String())
			}
		})
	}
}

// TestLongHandlerHeartbeat: a handler that runs for longer than the
// consumer's AckWait keeps its message: each renewal of the record's lease
// (every Lease/3, on the test clock here) tells JetStream the message is in
// progress, so it is not redelivered to another consumer meanwhile.
func TestLongHandlerHeartbeat(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	const ackWait = time.Second
	cons, _ := reconfigure(t, b, ackWait, -1)
	cfg := config(b.clock, nil)
	cfg.Guard.Clock = b.clock // the lease's heartbeat runs on it
	started, release := make(chan struct{}), make(chan struct{})
	c := idemnats.New(b.db.store, func(ctx context.Context, m jetstream.Msg) error {
		close(started)
		<-release
		return nil
	}, cfg)
	b.publish(t, "orders", `{"order":34}`, jetstream.MsgIDHeader, "order-34")
	outcome := make(chan idemnats.Outcome, 1)
	go func() {
		o, _ := c.Process(context.Background(), next(t, cons))
		outcome <- o
	}()
	<-started
	// A second consumer instance waits for a redelivery for 3 AckWaits.
	redelivered := make(chan jetstream.Msg, 1)
	go func() {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(3*ackWait))
		if err != nil {
			redelivered <- nil
			return
		}
		for m := range batch.Messages() {
			redelivered <- m
			return
		}
		redelivered <- nil
	}()
	deadline := time.Now().Add(3 * ackWait)
	for time.Now().Before(deadline) {
		b.clock.Advance(10 * time.Second) // Lease/3: a renewal
		time.Sleep(ackWait / 4)           // wall time for JetStream's AckWait
	}
	if m := <-redelivered; m != nil {
		md, _ := m.Metadata()
		t.Fatalf("the message was redelivered (delivery %d) while its handler ran", md.NumDelivered)
	}
	close(release)
	if o := <-outcome; o != idemnats.OutcomeCompleted {
		t.Fatalf("outcome %q, want completed", o)
	}
	waitSettled(t, cons)
}

// idemprom's Metrics counts the terminations.
var _ idemnats.TermMetrics = (*idemprom.Metrics)(nil)
