package outboxamqp_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem/internal/testenv"
	"github.com/idem-dev/idem/outbox"
	"github.com/idem-dev/idem/outbox/outboxamqp"

	_ "modernc.org/sqlite"
)

// setup connects to the test RabbitMQ (skipping without one) and declares
// a topic exchange and a queue of the test's own, bound to it with
// "payment.*", both deleted when the test ends.
func setup(t *testing.T) (conn *amqp.Connection, exchange, queue string) {
	t.Helper()
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, "IDEM_TEST_AMQP_URL (%s): %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	var b [6]byte
	rand.Read(b[:])
	exchange = "outboxamqp-test-" + hex.EncodeToString(b[:])
	queue = exchange + ".events"
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := ch.QueueDeclare(queue, true, false, false, false, amqp.Table{amqp.QueueTypeArg: amqp.QueueTypeQuorum}); err != nil {
		t.Fatal(err)
	}
	if err := ch.QueueBind(queue, "payment.*", exchange, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			return
		}
		defer ch.Close()
		ch.QueueDelete(queue, false, false, false)
		ch.ExchangeDelete(exchange, false, false)
	})
	return conn, exchange, queue
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

// get takes the next message of queue, failing when there is none.
func get(t *testing.T, conn *amqp.Connection, queue string) amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	d, ok, err := ch.Get(queue, true)
	if err != nil || !ok {
		t.Fatalf("no message in %s (%v)", queue, err)
	}
	return d
}

func depth(t *testing.T, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	return q.Messages
}

// TestRelayToRabbitMQ: a relay publishes the outbox's messages with
// publisher confirms, the idempotency key as message-id and the topic as
// routing key and type; once the relay recorded them done they are in the
// bound queue, persistent JSON.
func TestRelayToRabbitMQ(t *testing.T) {
	t.Parallel()
	conn, exchange, queue := setup(t)
	msgs := []outbox.Message{
		{Topic: "payment.succeeded", Payload: []byte(`{"payment_id":"pay_1"}`), IdempotencyKey: "idem-key-1"},
		{Topic: "payment.succeeded", Payload: []byte(`{"payment_id":"pay_2"}`), IdempotencyKey: "idem-key-2"},
	}
	store := newOutbox(t, msgs...)
	pub := outboxamqp.New(conn, &outboxamqp.Config{Exchange: exchange})
	defer pub.Close()
	relay := outbox.NewRelay(store, &outbox.RelayConfig{Deliver: pub.Publish})
	ctx := context.Background()
	if n, err := relay.RunOnce(ctx); n != 2 || err != nil {
		t.Fatalf("RunOnce: %d, %v; want 2 delivered", n, err)
	}
	if counts, _ := store.MessageCounts(ctx); counts[outbox.StateDone] != 2 {
		t.Fatalf("outbox: %v, want 2 done", counts)
	}
	for _, m := range msgs {
		d := get(t, conn, queue)
		if d.MessageId != m.IdempotencyKey || string(d.Body) != string(m.Payload) || d.RoutingKey != m.Topic ||
			d.Type != m.Topic || d.ContentType != "application/json" || d.DeliveryMode != amqp.Persistent {
			t.Errorf("got %s %s %s %s %s %d, want %s %s", d.MessageId, d.RoutingKey, d.Type, d.ContentType, d.Body, d.DeliveryMode, m.IdempotencyKey, m.Payload)
		}
	}
}

// TestConcurrentReturns: 60 messages published at once on one Publisher,
// every third to a routing key no binding matches: each unroutable one is
// retry (returned, nothing stored), each other delivered, and exactly the
// delivered ones are in the queue. A return is never taken for another
// message's.
func TestConcurrentReturns(t *testing.T) {
	t.Parallel()
	conn, exchange, queue := setup(t)
	pub := outboxamqp.New(conn, &outboxamqp.Config{Exchange: exchange})
	defer pub.Close()
	const n = 60
	outcomes := make([]outbox.Outcome, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		topic := "payment.succeeded"
		if i%3 == 0 {
			topic = "refund.succeeded"
		}
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			outcomes[i], errs[i] = pub.Publish(ctx, outbox.Message{Topic: topic, Payload: []byte(`{}`), IdempotencyKey: fmt.Sprint("key-", i)})
		})
	}
	wg.Wait()
	for i := range n {
		want := outbox.OutcomeDelivered
		if i%3 == 0 {
			want = outbox.OutcomeRetry
		}
		if outcomes[i] != want {
			t.Errorf("message %d: %v (%v), want %v", i, outcomes[i], errs[i], want)
		}
	}
	if got := depth(t, conn, queue); got != n-n/3 {
		t.Fatalf("%d messages in the queue, want %d", got, n-n/3)
	}
}

// TestClosed: a publish on a closed connection is retry: nothing was sent.
func TestClosed(t *testing.T) {
	t.Parallel()
	_, exchange, _ := setup(t)
	conn, err := amqp.Dial(testenv.AMQPURL(t)) // its own: setup's deletes the queues
	if err != nil {
		t.Fatal(err)
	}
	pub := outboxamqp.New(conn, &outboxamqp.Config{Exchange: exchange})
	defer pub.Close()
	conn.Close()
	o, err := pub.Publish(context.Background(), outbox.Message{Topic: "payment.succeeded", Payload: []byte(`{}`), IdempotencyKey: "key"})
	if o != outbox.OutcomeRetry || err == nil || !errors.Is(err, amqp.ErrClosed) {
		t.Fatalf("closed connection: %v (%v), want retry", o, err)
	}
}
