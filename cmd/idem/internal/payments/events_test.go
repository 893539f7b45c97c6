package payments

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/outbox"
)

// publisher is an outbox.Publisher that records what it is given and
// answers with outcome.
type publisher struct {
	mu      sync.Mutex
	outcome outbox.Outcome
	got     []outbox.Message
}

func (p *publisher) Publish(_ context.Context, m outbox.Message) (outbox.Outcome, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.got = append(p.got, m)
	if p.outcome != outbox.OutcomeDelivered {
		return p.outcome, errors.New("the broker is away")
	}
	return p.outcome, nil
}

func (p *publisher) messages() []outbox.Message {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]outbox.Message(nil), p.got...)
}

// TestSucceededEvent: with Config.Events, the charge's success and its
// payment.succeeded event commit together, and the next relay pass
// publishes the event, with an id derived from the payment's request as
// the idempotency key; a refused publish is retried with the same id, and
// the reconciler settling the payment again enqueues nothing more. Without
// Config.Events no event is written.
func TestSucceededEvent(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		pub := &publisher{outcome: outbox.OutcomeRetry}
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.Events = pub })
		p := b.mustCreate(t, "event-1", 2500)
		b.relayOnce(t, 1) // the charge; the event is enqueued with the success
		if got := b.count(t, "idem_outbox"); got != 2 {
			t.Fatalf("%d outbox rows after the charge, want 2 (the charge's and the event's)", got)
		}
		if len(pub.messages()) != 0 {
			t.Fatal("the event was published in the charge's pass")
		}
		b.relayOnce(t, 1) // the event: refused, retried after a backoff
		b.clock.Advance(time.Minute)
		pub.mu.Lock()
		pub.outcome = outbox.OutcomeDelivered
		pub.mu.Unlock()
		b.relayOnce(t, 1)
		b.relayOnce(t, 0)

		got := pub.messages()
		if len(got) != 2 || got[0].IdempotencyKey != got[1].IdempotencyKey || string(got[0].Payload) != string(got[1].Payload) {
			t.Fatalf("published %+v; want the same event twice (refused, then delivered)", got)
		}
		m := got[1]
		var ev Event
		if err := json.Unmarshal(m.Payload, &ev); err != nil {
			t.Fatal(err)
		}
		c := b.oneChargeFor(t, p)
		want := Event{ID: eventKey(b.providerKey(t, p.ID)), Type: "payment.succeeded", PaymentID: p.ID, Tenant: tenantA,
			CustomerID: p.CustomerID, AmountCents: 2500, Currency: p.Currency, ChargeID: c.ID, OccurredAt: ev.OccurredAt}
		if m.Topic != TopicPaymentSucceeded || m.IdempotencyKey != want.ID || ev != want {
			t.Fatalf("event %s %s %+v, want %+v", m.Topic, m.IdempotencyKey, ev, want)
		}

		// A second success of the same payment (the reconciler finding the
		// charge again) changes nothing and enqueues nothing.
		now := b.clock.Now()
		changed, err := b.svc.db.repo.markSucceeded(b.ctx, b.svc.db.outbox, p.ID, c.ID, now, b.svc.succeededEvent(p, c.ID, now))
		if err != nil || changed {
			t.Fatalf("markSucceeded again: %v, %v; want no change", changed, err)
		}
		if got := b.count(t, "idem_outbox"); got != 2 {
			t.Fatalf("%d outbox rows, want 2", got)
		}
	})
}

// TestNoEvents: without Config.Events a succeeded payment writes no event.
func TestNoEvents(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite:"+t.TempDir()+"/pay.db", provider.Faults{}, nil)
	b.mustCreate(t, "event-2", 2500)
	b.relayOnce(t, 1)
	b.relayOnce(t, 0)
	if got := b.count(t, "idem_outbox"); got != 1 {
		t.Fatalf("%d outbox rows, want only the charge's", got)
	}
}
