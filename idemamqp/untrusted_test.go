package idemamqp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemcrypt"
)

// TestResponseUntrusted: a message whose id completed but whose stored
// outcome fails verification (stored in the clear, refused by
// EncryptionRequired: idem.ErrResponseUntrusted) is never run again and
// is held as Config.Unknown says, logged as an error with
// outcome=untrusted, instead of going through the delay queue every
// RetryDelay for ever as though the store were down.
func TestResponseUntrusted(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", 0)
	var runs atomic.Int64
	handler := func(context.Context, *amqp.Delivery) error {
		runs.Add(1)
		return nil
	}
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	clear := b.newConsumer(t, b.db.store, handler, cfg)

	secret := make([]byte, idemcrypt.KeySize)
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "k1", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	scfg := config(b.clock, &log)
	scfg.MessageID = eventID
	scfg.Guard.Keyring, scfg.Guard.EncryptionRequired = kr, true
	sealed := b.newConsumer(t, b.db.store, handler, scfg)

	b.publish(t, `{"cents":500}`, withEvent("evt-1"))
	b.publish(t, `{"cents":500}`, withEvent("evt-1"))
	b.process(t, clear, idemamqp.OutcomeCompleted)
	b.process(t, sealed, idemamqp.OutcomeUntrusted)
	d := b.process(t, sealed, idemamqp.OutcomeUntrusted) // held, so it came back
	if d.Headers["x-death"] == nil {
		t.Fatalf("the second delivery is not the copy back from the delay queue: %v", d.Headers)
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	if logs := log.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "outcome=untrusted") || !strings.Contains(logs, "holds=1") {
		t.Errorf("no error logged with outcome=untrusted and its holds:\n%s", logs)
	}
}
