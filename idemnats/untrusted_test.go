package idemnats_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemnats"
)

// TestResponseUntrusted: a message whose id completed but whose stored
// outcome fails verification (stored in the clear, refused by
// EncryptionRequired: idem.ErrResponseUntrusted) is never run again and
// is held as Config.Unknown says, logged as an error with
// outcome=untrusted, instead of being nak'ed every RetryDelay for ever as
// though the store were down.
func TestResponseUntrusted(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite", nil)
	var runs atomic.Int64
	handler := func(context.Context, jetstream.Msg) error {
		runs.Add(1)
		return nil
	}
	cfg := config(b.clock, nil)
	cfg.MessageID = eventID
	clear := idemnats.New(b.db.store, handler, cfg)

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
	sealed := idemnats.New(b.db.store, handler, scfg)

	// Two copies of one event (no Nats-Msg-Id, so the stream keeps both).
	b.publish(t, "events", `{"cents":500}`, "Event-Id", "evt-1")
	b.publish(t, "events", `{"cents":500}`, "Event-Id", "evt-1")
	b.process(t, clear, idemnats.OutcomeCompleted)
	b.process(t, sealed, idemnats.OutcomeUntrusted)
	m := b.process(t, sealed, idemnats.OutcomeUntrusted) // held, so it came back
	if md, _ := m.Metadata(); md.NumDelivered != 2 {
		t.Fatalf("delivery %d, want the redelivery of the held copy (2)", md.NumDelivered)
	}
	if runs.Load() != 1 {
		t.Fatalf("the handler ran %d times, want 1", runs.Load())
	}
	if logs := log.String(); !strings.Contains(logs, "level=ERROR") || !strings.Contains(logs, "outcome=untrusted") {
		t.Errorf("no error logged with outcome=untrusted:\n%s", logs)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if info, err := b.cons.Info(ctx); err != nil || info.NumAckPending != 1 {
		t.Fatalf("consumer: %+v, %v; want the held copy still awaiting its ack", info, err)
	}
}
