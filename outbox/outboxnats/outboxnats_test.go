package outboxnats_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem/internal/testenv"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/outboxnats"

	_ "modernc.org/sqlite"
)

// connect returns the test JetStream (skipping without one) and a stream
// of the test's own on the subjects NAME.>, deleted when the test ends.
func connect(t *testing.T) (*nats.Conn, jetstream.JetStream, string) {
	t.Helper()
	url := testenv.NATSURL(t)
	nc, err := nats.Connect(url)
	if err != nil {
		testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s): %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var b [6]byte
	rand.Read(b[:])
	name := "OUTBOXNATS_" + strings.ToUpper(hex.EncodeToString(b[:]))
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}); err != nil {
		testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s) does not run JetStream: %v", url, err)
	}
	t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
	return nc, js, name
}

// newOutbox returns a migrated SQLite outbox with msgs enqueued and
// committed.
func newOutbox(t *testing.T, msgs ...outbox.Message) *outbox.SQLiteStore {
	t.Helper()
	db, err := sql.Open("sqlite", filepath.Join(t.TempDir(), "app.db")+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	store := outbox.NewSQLite(db, nil)
	ctx := context.Background()
	if _, err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range msgs {
		if _, err := store.Enqueue(ctx, tx, m); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	return store
}

// TestRelayToJetStream: a relay publishes the outbox's messages to their
// subjects with the idempotency key as Nats-Msg-Id; sending one again (as a
// relay does after an unknown outcome) is dropped by the stream's
// duplicate window, so the stream holds each message once.
func TestRelayToJetStream(t *testing.T) {
	t.Parallel()
	_, js, stream := connect(t)
	msgs := []outbox.Message{
		{Topic: stream + ".payment.succeeded", Payload: []byte(`{"payment_id":"pay_1"}`), IdempotencyKey: "idem-key-1"},
		{Topic: stream + ".payment.succeeded", Payload: []byte(`{"payment_id":"pay_2"}`), IdempotencyKey: "idem-key-2"},
	}
	store := newOutbox(t, msgs...)
	pub := outboxnats.New(js, nil)
	relay := outbox.NewRelay(store, &outbox.RelayConfig{Deliver: pub.Publish})
	ctx := context.Background()
	if n, err := relay.RunOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RunOnce: %d, %v; want 2 delivered", n, err)
	}
	if counts, _ := store.MessageCounts(ctx); counts[outbox.StateDone] != 2 {
		t.Fatalf("outbox: %v, want 2 done", counts)
	}
	if o, err := pub.Publish(ctx, msgs[0]); o != outbox.OutcomeDelivered {
		t.Fatalf("sending again: %v (%v), want delivered (a duplicate)", o, err)
	}

	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 {
		t.Fatalf("the stream holds %d messages, want 2 (the copy dropped)", info.State.Msgs)
	}
	for seq, m := range map[uint64]outbox.Message{1: msgs[0], 2: msgs[1]} {
		got, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if got.Header.Get(jetstream.MsgIDHeader) != m.IdempotencyKey || string(got.Data) != string(m.Payload) || got.Subject != m.Topic {
			t.Errorf("message %d: %s %s %s, want %s %s %s", seq, got.Subject, got.Header.Get(jetstream.MsgIDHeader), got.Data, m.Topic, m.IdempotencyKey, m.Payload)
		}
	}
}

// TestOutcomes: a subject no stream takes, and a closed connection, are
// retried (nothing was stored); a custom Subject maps the topic.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	nc, js, stream := connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m := outbox.Message{Topic: "payment.succeeded", Payload: []byte(`{}`), IdempotencyKey: "idem-key-3"}

	if o, err := outboxnats.New(js, nil).Publish(ctx, m); o != outbox.OutcomeRetry || err == nil {
		t.Fatalf("no stream for the subject: %v (%v), want retry", o, err)
	}
	mapped := outboxnats.New(js, &outboxnats.Config{Subject: func(m outbox.Message) string { return stream + "." + m.Topic }})
	if o, err := mapped.Publish(ctx, m); o != outbox.OutcomeDelivered {
		t.Fatalf("mapped subject: %v (%v), want delivered", o, err)
	}
	nc.Close()
	if o, err := mapped.Publish(ctx, m); o != outbox.OutcomeRetry {
		t.Fatalf("closed connection: %v (%v), want retry", o, err)
	}
}
