package e2e

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/internal/testenv"

	_ "modernc.org/sqlite"
)

// consumerEnv makes this test binary the consumer of TestPipelineKills
// (see runConsumer): "KIND|URL|NAME|DB", KIND nats or amqp, the broker's
// URL, the stream (NATS) or exchange (RabbitMQ) of the test, and the
// consumer's SQLite database.
const consumerEnv = "IDEM_E2E_CONSUMER"

// TestPipelineKills runs the whole pipeline: clients pay through `idem
// payments --events URL`, the relay charges the provider and the payment's
// success writes a payment.succeeded event to the outbox in the same
// transaction, the relay publishes it (NATS JetStream or RabbitMQ), and a
// consumer process (this test binary, the README's consumer: idemnats or
// idemamqp in transactional mode on SQLite) settles each event by writing
// one row to its billed table, which has no unique constraint. While the
// payments are made, the payments service and the consumer are SIGKILLed
// at random moments, one at a time, and restarted. Every payment must end
// succeeded with exactly one billed row, under its event's id.
func TestPipelineKills(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"nats", "amqp"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			pipelineKills(t, kind)
		})
	}
}

func pipelineKills(t *testing.T, kind string) {
	const n, workers = 30, 6
	dir := t.TempDir()
	name := "idem-e2e-" + randomHex(6)
	var events string
	var drained func() bool
	switch kind {
	case "nats":
		name = strings.ToUpper(strings.ReplaceAll(name, "-", "_"))
		raw := testenv.NATSURL(t)
		nc, err := nats.Connect(raw)
		if err != nil {
			testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s): %v", raw, err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".payment.succeeded"}}); err != nil {
			testenv.Unavailable(t, "IDEM_TEST_NATS_URL (%s) does not run JetStream: %v", raw, err)
		}
		t.Cleanup(func() { js.DeleteStream(context.Background(), name) })
		events = raw + "?" + url.Values{"subject": {name + ".payment.succeeded"}, "stream": {name}}.Encode()
		drained = func() bool {
			cons, err := js.Consumer(ctx, name, "billing")
			if err != nil {
				return false
			}
			info, err := cons.Info(ctx)
			return err == nil && info.NumPending == 0 && info.NumAckPending == 0
		}
	case "amqp":
		raw := testenv.AMQPURL(t)
		conn, err := amqp.Dial(raw)
		if err != nil {
			testenv.Unavailable(t, "IDEM_TEST_AMQP_URL (%s): %v", raw, err)
		}
		t.Cleanup(func() { conn.Close() })
		// The consumer's queues exist before the first event: a message
		// no queue takes is returned to the relay, which retries it.
		if err := declareBilling(conn, name); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ch, err := conn.Channel()
			if err != nil {
				return
			}
			defer ch.Close()
			for _, q := range []string{name + ".billing", name + ".billing.delay", name + ".billing.dead"} {
				ch.QueueDelete(q, false, false, false)
			}
			ch.ExchangeDelete(name, false, false)
		})
		sep := "?"
		if strings.Contains(raw, "?") {
			sep = "&"
		}
		events = raw + sep + "exchange=" + url.QueryEscape(name)
		drained = func() bool {
			ch, err := conn.Channel()
			if err != nil {
				return false
			}
			defer ch.Close()
			total := 0
			for _, q := range []string{name + ".billing", name + ".billing.delay"} {
				info, err := ch.QueueDeclarePassive(q, true, false, false, false, nil)
				if err != nil {
					return false
				}
				total += info.Messages
			}
			return total == 0
		}
	}

	bank := startBank(t, "sqlite:"+filepath.Join(dir, "bank.db"))
	payDB := filepath.Join(dir, "payments.db")
	svc := newService(t, "sqlite:"+payDB, bank.URL, "--events", events)
	svc.restart("")
	billedDB := filepath.Join(dir, "billing.db")
	spec := strings.Join([]string{kind, events, name, billedDB}, "|")
	consumers := 0
	startConsumer := func() *proc {
		consumers++
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(idembin.Environ(), consumerEnv+"="+spec)
		return start(t, fmt.Sprintf("consumer#%d", consumers), cmd)
	}
	consumer := startConsumer()

	// The payments, made by retrying clients while the processes die.
	client := newPayClient(t, 3*time.Minute)
	ids := make([]string, n)
	var wg sync.WaitGroup
	next := make(chan int)
	errs := make(chan error, n)
	for range workers {
		wg.Go(func() {
			for i := range next {
				c, err := createPayment(t.Context(), client, svc.base(), fmt.Sprintf("pipeline-%d", i), paymentBody(fmt.Sprint("cus_", i), int64(100+i)))
				if err != nil {
					errs <- err
					continue
				}
				ids[i] = c.ID
			}
		})
	}
	made := make(chan struct{})
	go func() {
		for i := range n {
			next <- i
		}
		close(next)
		wg.Wait()
		close(made)
	}()

	// The killer: one process at a time, at random moments, at least ten
	// times and until the payments are made.
	kills := map[string]int{}
	for round := 0; round < 10 || !isClosed(made); round++ {
		time.Sleep(time.Duration(200+rand.IntN(900)) * time.Millisecond)
		if rand.IntN(2) == 0 {
			svc.proc.kill()
			kills["payments"]++
			svc.restart("")
		} else {
			consumer.kill()
			kills["consumer"]++
			consumer = startConsumer()
		}
	}
	close(errs)
	for err := range errs {
		t.Fatalf("a payment failed: %v", err)
	}
	t.Logf("killed the payments service %d times, the consumer %d times", kills["payments"], kills["consumer"])

	settled := awaitSettled(t, svc.base(), ids, 2*time.Minute)
	for _, p := range settled {
		if p.Status != "succeeded" {
			t.Fatalf("payment %s: %s (%s), want succeeded", p.ID, p.Status, p.FailureReason)
		}
	}

	// Every event published (no outbox row pending) and consumed (nothing
	// left at the broker), then the count.
	deadline := time.Now().Add(2 * time.Minute)
	for !(pendingOutbox(t, payDB) == 0 && drained() && billedEvents(t, billedDB) == n) {
		if time.Now().After(deadline) {
			t.Fatalf("after 2 minutes: %d outbox rows pending, broker drained %v, %d of %d events billed",
				pendingOutbox(t, payDB), drained(), billedEvents(t, billedDB), n)
		}
		time.Sleep(100 * time.Millisecond) // the processes run on real time
	}
	consumer.kill() // nothing more is written

	db, err := sql.Open("sqlite", "file:"+billedDB+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	rows, err := db.Query(`SELECT payment_id, event_id, COUNT(*) FROM billed GROUP BY payment_id, event_id`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	billed := map[string]int{}
	eventOf := map[string]string{}
	for rows.Next() {
		var pay, ev string
		var c int
		if err := rows.Scan(&pay, &ev, &c); err != nil {
			t.Fatal(err)
		}
		billed[pay] += c
		if eventOf[pay] != "" {
			t.Errorf("payment %s billed under two event ids", pay)
		}
		eventOf[pay] = ev
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if billed[id] != 1 {
			t.Errorf("payment %s billed %d times, want exactly once", id, billed[id])
		}
		delete(billed, id)
	}
	if len(billed) != 0 {
		t.Errorf("billed payments that were never made: %v", billed)
	}
}

func isClosed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// pendingOutbox counts the payments service's outbox rows still pending.
func pendingOutbox(t *testing.T, path string) int {
	t.Helper()
	return countSQLite(t, path, `SELECT COUNT(*) FROM idem_outbox WHERE state = 'pending'`)
}

// billedEvents counts the distinct events the consumer billed.
func billedEvents(t *testing.T, path string) int {
	t.Helper()
	if _, err := os.Stat(path); err != nil {
		return 0
	}
	return countSQLite(t, path, `SELECT COUNT(DISTINCT event_id) FROM billed`)
}

func countSQLite(t *testing.T, path, query string) int {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var n int
	if err := db.QueryRow(query).Scan(&n); err != nil {
		if strings.Contains(err.Error(), "no such table") {
			return 0
		}
		t.Fatalf("%s: %v", query, err)
	}
	return n
}

// declareBilling declares the billing consumer's queues (idemamqp.Declare)
// and binds the work queue to the exchange the payments service publishes
// to, declaring it as the service does.
func declareBilling(conn *amqp.Connection, exchange string) error {
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	defer ch.Close()
	if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return err
	}
	if err := idemamqp.Declare(context.Background(), conn, exchange+".billing", nil); err != nil {
		return err
	}
	return ch.QueueBind(exchange+".billing", "payment.succeeded", exchange, false, nil)
}

// runConsumer is the consumer process of TestPipelineKills: the README's
// consumer of payment.succeeded events, which bills each event once in
// transactional mode on SQLite. It runs until killed.
func runConsumer(spec string) int {
	logger := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	fail := func(err error) int {
		logger.Error("consumer failed", "error", err)
		return 3
	}
	time.AfterFunc(childMaxLife+3*time.Minute, func() {
		logger.Error("consumer outlived its test")
		os.Exit(4)
	})
	parts := strings.SplitN(spec, "|", 4)
	if len(parts) != 4 {
		return fail(fmt.Errorf("%s=%q", consumerEnv, spec))
	}
	kind, rawURL, name, path := parts[0], parts[1], parts[2], parts[3]

	store, err := idemsqlite.Open(path, nil)
	if err != nil {
		return fail(err)
	}
	defer store.Close()
	// No unique constraint: the test counts the rows of each event.
	if _, err := store.DB().Exec(`CREATE TABLE IF NOT EXISTS billed (
		event_id TEXT NOT NULL, payment_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`); err != nil {
		return fail(err)
	}
	// bill is the effect: one row, in the transaction that completes the
	// event's record.
	bill := func(ctx context.Context, body []byte) error {
		var ev struct {
			ID          string `json:"id"`
			PaymentID   string `json:"payment_id"`
			AmountCents int64  `json:"amount_cents"`
		}
		if err := json.Unmarshal(body, &ev); err != nil {
			return err
		}
		tx, err := idemsqlite.TxFromContext(ctx)
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO billed (event_id, payment_id, amount_cents) VALUES (?, ?, ?)`,
			ev.ID, ev.PaymentID, ev.AmountCents)
		return err
	}
	core := idem.GuardConfig{Transactional: true, Lease: 2 * time.Second, Logger: logger}
	ctx := context.Background()

	switch kind {
	case "nats":
		u, err := url.Parse(rawURL)
		if err != nil {
			return fail(err)
		}
		u.RawQuery = ""
		nc, err := nats.Connect(u.String())
		if err != nil {
			return fail(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			return fail(err)
		}
		cons, err := js.CreateOrUpdateConsumer(ctx, name, jetstream.ConsumerConfig{
			Durable: "billing", AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second,
		})
		if err != nil {
			return fail(err)
		}
		billing := idemnats.New(store, func(ctx context.Context, msg jetstream.Msg) error {
			return bill(ctx, msg.Data())
		}, &idemnats.Config{Guard: core})
		if _, err := cons.Consume(billing.Handle); err != nil {
			return fail(err)
		}
		logger.Warn("listening", "addr", "billing")
		select {}
	case "amqp":
		u, err := url.Parse(rawURL)
		if err != nil {
			return fail(err)
		}
		u.RawQuery = ""
		conn, err := amqp.Dial(u.String())
		if err != nil {
			return fail(err)
		}
		billing := idemamqp.New(conn, name+".billing", store, func(ctx context.Context, d *amqp.Delivery) error {
			return bill(ctx, d.Body)
		}, &idemamqp.Config{Guard: core})
		logger.Warn("listening", "addr", "billing")
		return fail(errors.Join(errors.New("the consumer stopped"), billing.Run(ctx)))
	}
	return fail(fmt.Errorf("unknown consumer kind %q", kind))
}
