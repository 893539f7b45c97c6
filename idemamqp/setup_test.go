package idemamqp_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/integration/teststore"
	"github.com/idem-dev/idem/internal/testenv"
)

// connect returns a connection to the test RabbitMQ, closed when the test
// ends. A broker that is absent skips the test (fails it under
// IDEM_TEST_REQUIRE_ALL=1).
func connect(t testing.TB) *amqp.Connection {
	t.Helper()
	url := testenv.AMQPURL(t)
	conn, err := amqp.Dial(url)
	if err != nil {
		testenv.Unavailable(t, "IDEM_TEST_AMQP_URL (%s): %v", url, err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// newQueue returns a unique queue name; its three queues (QUEUE,
// QUEUE.delay, QUEUE.dead) are deleted when the test ends.
func newQueue(t testing.TB, conn *amqp.Connection) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := "idemamqp-test-" + hex.EncodeToString(b[:])
	t.Cleanup(func() {
		ch, err := conn.Channel()
		if err != nil {
			t.Errorf("deleting queues %s: %v", name, err)
			return
		}
		defer ch.Close()
		for _, q := range []string{name, name + ".delay", name + ".dead"} {
			if _, err := ch.QueueDelete(q, false, false, false); err != nil {
				t.Errorf("deleting queue %s: %v", q, err)
			}
		}
	})
	return name
}

// declare declares queue's three queues with deliveryLimit (the default
// when 0).
func declare(t testing.TB, conn *amqp.Connection, queue string, deliveryLimit int) {
	t.Helper()
	if err := idemamqp.Declare(context.Background(), conn, queue, &idemamqp.Config{DeliveryLimit: deliveryLimit}); err != nil {
		t.Fatal(err)
	}
}

// bundle is what setup returns.
type bundle struct {
	conn  *amqp.Connection
	queue string // queues of their own (see newQueue)
	clock *idemtest.Clock
	db    *testDB // a store of the kind asked for, on clock
	cons  *testConsumer
}

// setup connects to RabbitMQ and declares queues of the test's own with
// deliveryLimit (the default when 0), a test clock and a store of kind
// with an empty ledger.
func setup(t testing.TB, kind string, deliveryLimit int) *bundle {
	t.Helper()
	conn := connect(t)
	b := &bundle{conn: conn, queue: newQueue(t, conn), clock: newClock()}
	declare(t, conn, b.queue, deliveryLimit)
	b.db = newDB(t, kind, b.clock.Now)
	b.cons = &testConsumer{conn: conn, queue: b.queue}
	t.Cleanup(b.cons.stop)
	return b
}

// newConsumer returns a Consumer of the test queue, closed when the test
// ends.
func (b *bundle) newConsumer(t testing.TB, store idemstore.Store, h idemamqp.Handler, cfg *idemamqp.Config) *idemamqp.Consumer {
	t.Helper()
	c := idemamqp.New(b.conn, b.queue, store, h, cfg)
	t.Cleanup(func() { c.Close() })
	return c
}

// publish publishes body to the test queue (see publish).
func (b *bundle) publish(t testing.TB, body string, p amqp.Publishing) {
	t.Helper()
	publish(t, b.conn, b.queue, body, p)
}

// process processes the queue's next message with c and checks the
// outcome.
func (b *bundle) process(t testing.TB, c *idemamqp.Consumer, want idemamqp.Outcome) *amqp.Delivery {
	t.Helper()
	d := b.cons.next(t)
	got, err := c.Process(context.Background(), d)
	if got != want {
		t.Fatalf("delivery %q (redelivered %v, headers %v): outcome %q (%v), want %q", d.MessageId, d.Redelivered, d.Headers, got, err, want)
	}
	return d
}

// record reads the record of key at the test queue's endpoint.
func (b *bundle) record(t testing.TB, key string) *idemstore.Record {
	t.Helper()
	return getRecord(t, b.db.store, endpoint(b.queue), key)
}

// settled stops the test consumer (a message it holds un-acked goes back
// to the queue) and fails unless the work and delay queues are empty.
func (b *bundle) settled(t testing.TB) {
	t.Helper()
	b.cons.stop()
	if work, delay := count(t, b.conn, b.queue), count(t, b.conn, b.queue+".delay"); work != 0 || delay != 0 {
		t.Fatalf("%d messages in the work queue, %d in the delay queue; want none", work, delay)
	}
}

// publish publishes body to queue through the default exchange, with p's
// properties, persistent, and waits for the broker's confirm.
func publish(t testing.TB, conn *amqp.Connection, queue, body string, p amqp.Publishing) {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	if err := ch.Confirm(false); err != nil {
		t.Fatal(err)
	}
	p.Body = []byte(body)
	p.DeliveryMode = amqp.Persistent
	dc, err := ch.PublishWithDeferredConfirm("", queue, true, false, p)
	if err != nil {
		t.Fatalf("publishing: %v", err)
	}
	if !dc.Wait() {
		t.Fatal("the broker refused the message")
	}
}

// testConsumer consumes a queue for a test, one message at a time
// (prefetch 1), from its first next on.
type testConsumer struct {
	conn       *amqp.Connection
	queue      string
	mu         sync.Mutex
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
}

// next returns the next message the queue delivers (new, redelivered or
// back from the delay queue), failing after 30 seconds.
func (tc *testConsumer) next(t testing.TB) *amqp.Delivery {
	t.Helper()
	tc.mu.Lock()
	if tc.ch == nil {
		ch, err := tc.conn.Channel()
		if err != nil {
			tc.mu.Unlock()
			t.Fatal(err)
		}
		if err := ch.Qos(1, 0, false); err != nil {
			tc.mu.Unlock()
			t.Fatal(err)
		}
		ds, err := ch.Consume(tc.queue, "", false, false, false, false, nil)
		if err != nil {
			tc.mu.Unlock()
			t.Fatal(err)
		}
		tc.ch, tc.deliveries = ch, ds
	}
	ds := tc.deliveries
	tc.mu.Unlock()
	select {
	case d, ok := <-ds:
		if !ok {
			t.Fatal("the test consumer's channel closed")
		}
		return &d
	case <-time.After(30 * time.Second):
		t.Fatal("no message delivered within 30s")
	}
	return nil
}

// stop closes the test consumer's channel: a message it holds un-acked
// goes back to the queue. The acks sent before reach the broker first.
func (tc *testConsumer) stop() {
	tc.mu.Lock()
	defer tc.mu.Unlock()
	if tc.ch != nil {
		tc.ch.Close()
		tc.ch, tc.deliveries = nil, nil
	}
}

// count returns the number of messages ready in queue.
func count(t testing.TB, conn *amqp.Connection, queue string) int {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(queue, true, false, false, false, nil)
	if err != nil {
		t.Fatalf("inspecting queue %s: %v", queue, err)
	}
	return q.Messages
}

// deadLetter waits up to 10 seconds for a message in queue's dead-letter
// queue (dead-lettering by the broker is asynchronous), takes it and
// returns it.
func deadLetter(t testing.TB, conn *amqp.Connection, queue string) *amqp.Delivery {
	t.Helper()
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	defer ch.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, ok, err := ch.Get(queue+".dead", true)
		if err != nil {
			t.Fatal(err)
		}
		if ok {
			return &d
		}
		if time.Now().After(deadline) {
			t.Fatalf("no message in %s.dead after 10s", queue)
		}
		time.Sleep(20 * time.Millisecond) // polling the broker's state, not a lease
	}
}

// deathReason returns the reason of d's latest x-death entry.
func deathReason(d *amqp.Delivery) string {
	deaths, _ := d.Headers["x-death"].([]any)
	if len(deaths) == 0 {
		return ""
	}
	t, _ := deaths[0].(amqp.Table)
	r, _ := t["reason"].(string)
	return r
}

// endpoint is the records' endpoint for the test queue.
func endpoint(queue string) string { return "amqp " + queue }

func newClock() *idemtest.Clock { return idemtest.NewClock(time.Now().Truncate(time.Millisecond)) }

// config is the tests' Config: the clock, quick returns from the delay
// queue, logs to log (discarded when nil).
func config(clock *idemtest.Clock, log *bytes.Buffer) *idemamqp.Config {
	var w io.Writer = io.Discard
	if log != nil {
		w = &syncWriter{w: log}
	}
	return &idemamqp.Config{
		Guard: idem.GuardConfig{
			Clock:        clock,
			StoreTimeout: 30 * time.Second,
			Logger:       slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug})),
		},
		HoldDelay:  50 * time.Millisecond,
		RetryDelay: 50 * time.Millisecond,
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

func (s *syncWriter) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.String()
}

// storeKinds are the durable stores the consumer tests run on.
var storeKinds = []string{"sqlite", "postgres"}

// testDB is a durable store made for one test, with a ledger table beside
// the idempotency records for the handlers' business writes.
type testDB struct {
	kind string
	// spec reopens it in another process: "sqlite:PATH" or
	// "postgres:SCHEMA".
	spec  string
	store idemstore.TxStore
	// sqlite or pg is the connection the ledger is read with.
	sqlite *sql.DB
	pg     *pgxpool.Pool
	schema string
}

// newDB makes a store of kind with an empty ledger table.
func newDB(t testing.TB, kind string, now func() time.Time) *testDB {
	t.Helper()
	store, spec := teststore.OpenDurable(t, kind, now)
	db := withLedger(t, store, spec)
	var err error
	switch kind {
	case "sqlite":
		_, err = db.sqlite.Exec(`CREATE TABLE ledger (msg_id TEXT NOT NULL PRIMARY KEY)`)
	case "postgres":
		_, err = db.pg.Exec(context.Background(), `CREATE TABLE `+pgx.Identifier{db.schema, "ledger"}.Sanitize()+` (msg_id text NOT NULL PRIMARY KEY)`)
	}
	if err != nil {
		t.Fatalf("creating the ledger: %v", err)
	}
	return db
}

// openDB opens the store spec names (see testDB.spec), closed when the
// test ends.
func openDB(t testing.TB, spec string, now func() time.Time) *testDB {
	t.Helper()
	return withLedger(t, teststore.Reopen(t, spec, now), spec)
}

// withLedger returns store with the connection its ledger is read with.
func withLedger(t testing.TB, store idemstore.TxStore, spec string) *testDB {
	t.Helper()
	kind, where, _ := strings.Cut(spec, ":")
	db := &testDB{kind: kind, spec: spec, store: store}
	switch kind {
	case "sqlite":
		db.sqlite = store.(*idemsqlite.Store).DB()
	case "postgres":
		db.pg, db.schema = teststore.Pool(t), where
	}
	return db
}

// record writes the ledger row of msgID in the attempt's transaction.
func (db *testDB) record(ctx context.Context, msgID string) error {
	switch db.kind {
	case "sqlite":
		tx, err := idemsqlite.TxFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO ledger (msg_id) VALUES (?)`, msgID)
		return err
	default:
		tx, err := idempgx.TxFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = tx.Exec(ctx, `INSERT INTO `+pgx.Identifier{db.schema, "ledger"}.Sanitize()+` (msg_id) VALUES ($1)`, msgID)
		return err
	}
}

// recordNow writes the ledger row of msgID outside any transaction,
// committed at once.
func (db *testDB) recordNow(ctx context.Context, msgID string) error {
	var err error
	switch db.kind {
	case "sqlite":
		_, err = db.sqlite.ExecContext(ctx, `INSERT INTO ledger (msg_id) VALUES (?)`, msgID)
	default:
		_, err = db.pg.Exec(ctx, `INSERT INTO `+pgx.Identifier{db.schema, "ledger"}.Sanitize()+` (msg_id) VALUES ($1)`, msgID)
	}
	return err
}

// rows counts the committed ledger rows.
func (db *testDB) rows(t testing.TB) int {
	t.Helper()
	var n int
	var err error
	switch db.kind {
	case "sqlite":
		err = db.sqlite.QueryRow(`SELECT count(*) FROM ledger`).Scan(&n)
	default:
		err = db.pg.QueryRow(context.Background(), `SELECT count(*) FROM `+pgx.Identifier{db.schema, "ledger"}.Sanitize()).Scan(&n)
	}
	if err != nil {
		t.Fatalf("counting ledger rows: %v", err)
	}
	return n
}

// getRecord reads the record of key at endpoint.
func getRecord(t testing.TB, store idemstore.Store, endpoint, key string) *idemstore.Record {
	t.Helper()
	rec, err := store.KeyGet(context.Background(), idemstore.Identity{Endpoint: endpoint, Key: key})
	if err != nil {
		t.Fatalf("reading the record of %s: %v", key, err)
	}
	return rec
}

// counter counts handler runs per message id.
type counter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *counter) add(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	return c.n[id]
}

// handler returns a handler that counts its runs under the id that id
// reads from the message.
func (c *counter) handler(id func(*amqp.Delivery) string) idemamqp.Handler {
	return func(_ context.Context, m *amqp.Delivery) error {
		c.add(id(m))
		return nil
	}
}

func (c *counter) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

// decisions is an idem.Metrics that counts decisions per endpoint.
type decisions struct {
	mu sync.Mutex
	n  map[string]int
}

func (d *decisions) Decision(endpoint, scope string, dec idem.Decision) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.n == nil {
		d.n = map[string]int{}
	}
	d.n[fmt.Sprintf("%s %s", endpoint, dec)]++
}

func (d *decisions) get(endpoint string, dec idem.Decision) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[fmt.Sprintf("%s %s", endpoint, dec)]
}

func (*decisions) StoreCall(string, time.Duration, error) {}
func (*decisions) ResponseStored(string, int)             {}
