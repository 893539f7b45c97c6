package idemnats_test

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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idempgx"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/integration/teststore"
	"github.com/idem-dev/idem/internal/testenv"
)

// connect returns a connection to the test NATS server and its JetStream,
// closed when the test ends. A server that is absent or runs without
// JetStream skips the test (fails it under IDEM_TEST_REQUIRE_ALL=1).
func connect(t testing.TB) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	url := testenv.NATSURL(t)
	nc, err := nats.Connect(url, nats.Name("idemnats-test"))
	if err != nil {
		testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s): %v", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := js.AccountInfo(ctx); err != nil {
		testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s) does not run JetStream (start nats-server with -js): %v", url, err)
	}
	return nc, js
}

// newStream creates a memory stream with a unique name on the subjects
// NAME.>, deleted when the test ends. mod, when not nil, adjusts its
// configuration.
func newStream(t testing.TB, js jetstream.JetStream, mod func(*jetstream.StreamConfig)) string {
	t.Helper()
	var b [6]byte
	rand.Read(b[:])
	name := "IDEMNATS_" + strings.ToUpper(hex.EncodeToString(b[:]))
	cfg := jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}, Storage: jetstream.MemoryStorage}
	if mod != nil {
		mod(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, name); err != nil {
			t.Errorf("deleting stream %s: %v", name, err)
		}
	})
	return name
}

// bundle is what setup returns.
type bundle struct {
	js     jetstream.JetStream
	stream string             // a stream of its own (see newStream)
	cons   jetstream.Consumer // its durable consumer "worker", AckWait 30s
	clock  *idemtest.Clock
	db     *testDB // a store of the kind asked for, on clock
}

// setup connects to JetStream and makes a stream (mod, when not nil,
// adjusts its configuration) with its durable consumer, a test clock and a
// store of kind with an empty ledger.
func setup(t testing.TB, kind string, mod func(*jetstream.StreamConfig)) *bundle {
	t.Helper()
	_, js := connect(t)
	stream := newStream(t, js, mod)
	b := &bundle{js: js, stream: stream, cons: durable(t, js, stream, 30*time.Second), clock: newClock()}
	b.db = newDB(t, kind, b.clock.Now)
	return b
}

// publish publishes data on the subject STREAM.subject (see publish).
func (b *bundle) publish(t testing.TB, subject, data string, header ...string) *jetstream.PubAck {
	t.Helper()
	return publish(t, b.js, b.stream+"."+subject, data, header...)
}

// process processes the consumer's next message with c and checks the
// outcome (see process).
func (b *bundle) process(t testing.TB, c *idemnats.Consumer, want idemnats.Outcome) jetstream.Msg {
	t.Helper()
	return process(t, c, b.cons, want)
}

// record reads the record of key at the test consumer's endpoint.
func (b *bundle) record(t testing.TB, key string) *idemstore.Record {
	t.Helper()
	return getRecord(t, b.db.store, endpoint(b.stream), key)
}

// worker is the durable consumer's name in every test.
const worker = "worker"

// durable returns the stream's durable pull consumer "worker", creating it
// with ackWait the first time.
func durable(t testing.TB, js jetstream.JetStream, stream string, ackWait time.Duration) jetstream.Consumer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, jetstream.ConsumerConfig{
		Durable:   worker,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   ackWait,
	})
	if err != nil {
		t.Fatalf("creating the consumer: %v", err)
	}
	return cons
}

// publish publishes data on subject with the headers given as name, value
// pairs.
func publish(t testing.TB, js jetstream.JetStream, subject, data string, header ...string) *jetstream.PubAck {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(data)
	for i := 0; i+1 < len(header); i += 2 {
		msg.Header.Set(header[i], header[i+1])
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		t.Fatalf("publishing: %v", err)
	}
	return ack
}

// next returns the next message the consumer delivers (new or
// redelivered), failing after 30 seconds.
func next(t testing.TB, cons jetstream.Consumer) jetstream.Msg {
	t.Helper()
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(30*time.Second))
	if err != nil {
		t.Fatalf("fetching: %v", err)
	}
	for m := range batch.Messages() {
		return m
	}
	t.Fatalf("no message delivered within 30s (%v)", batch.Error())
	return nil
}

// process fetches the next message, processes it with c and checks the
// outcome.
func process(t testing.TB, c *idemnats.Consumer, cons jetstream.Consumer, want idemnats.Outcome) jetstream.Msg {
	t.Helper()
	m := next(t, cons)
	got, err := c.Process(context.Background(), m)
	if got != want {
		md, _ := m.Metadata()
		t.Fatalf("delivery %d of stream message %d: outcome %q (%v), want %q", md.NumDelivered, md.Sequence.Stream, got, err, want)
	}
	return m
}

// waitSettled waits until the consumer has no message pending or awaiting
// an ack (acks and terms are sent without waiting for the server's answer),
// failing after 10 seconds.
func waitSettled(t testing.TB, cons jetstream.Consumer) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		info, err := cons.Info(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		if info.NumAckPending == 0 && info.NumPending == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the consumer still has %d messages awaiting an ack and %d pending", info.NumAckPending, info.NumPending)
		}
		time.Sleep(10 * time.Millisecond) // polling the server's state, not a lease
	}
}

// endpoint is the records' endpoint for the test consumer of stream.
func endpoint(stream string) string { return "nats " + stream + "/" + worker }

func newClock() *idemtest.Clock { return idemtest.NewClock(time.Now().Truncate(time.Millisecond)) }

// config is the tests' Config: the clock, quick redeliveries, logs to log
// (discarded when nil).
func config(clock *idemtest.Clock, log *bytes.Buffer) *idemnats.Config {
	var w io.Writer = io.Discard
	if log != nil {
		w = &syncWriter{w: log}
	}
	return &idemnats.Config{
		Guard:      idem.GuardConfig{Clock: clock, StoreTimeout: 30 * time.Second, Logger: slog.New(slog.NewTextHandler(w, &slog.HandlerOptions{Level: slog.LevelDebug}))},
		HoldDelay:  50 * time.Millisecond,
		RetryDelay: 50 * time.Millisecond,
		ErrorDelay: 50 * time.Millisecond,
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
func (c *counter) handler(id func(jetstream.Msg) string) idemnats.Handler {
	return func(_ context.Context, m jetstream.Msg) error {
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

// MessageTerminated counts a termination as the decision "terminated
// OUTCOME" (see idemnats.TermMetrics).
func (d *decisions) MessageTerminated(endpoint, outcome string) {
	d.Decision(endpoint, "", idem.Decision("terminated "+outcome))
}

func (*decisions) StoreCall(string, time.Duration, error) {}
func (*decisions) ResponseStored(string, int)             {}
