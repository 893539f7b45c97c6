package idemnats_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem/idemnats"
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
