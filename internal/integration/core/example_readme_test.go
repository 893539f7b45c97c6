package idem_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemsqlite"
)

// The examples in this file hold the README's Go snippets, verbatim between
// the "README" comments (the gRPC one is idemgrpc's Example);
// TestReadmeSnippets checks that every snippet of the README is one of
// them, so each compiles and, where it has an Output, runs.

// tenantFromAuth and createPayment are the application's, in the README's
// quick start.
func tenantFromAuth(r *http.Request) (string, error) {
	if r.Header.Get("Authorization") == "" {
		return "", errors.New("no credential")
	}
	return "tenant-a", nil
}

func createPayment(w http.ResponseWriter, r *http.Request) {
	w.WriteHeader(http.StatusCreated)
	io.WriteString(w, `{"id":"pay_1"}`)
}

// The README's quick start (compiled, not run: it opens ./idem.db).
func Example_readmeQuickStart() {
	// README
	store, err := idemsqlite.Open("idem.db", nil) // durable, WAL, synchronous=FULL
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()

	protect := idem.New(store, &idem.Config{
		RequireKey: true,
		Scope:      func(r *http.Request) (string, error) { return tenantFromAuth(r) },
	})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", protect(http.HandlerFunc(createPayment)))
	// README
	_ = http.ListenAndServe("127.0.0.1:8080", mux)
}

// paymentsAPI serves the quick start's route on the memory store and
// returns its URL.
func paymentsAPI() (string, func()) {
	protect := idem.New(idemmem.New(nil), &idem.Config{RequireKey: true})
	mux := http.NewServeMux()
	mux.Handle("POST /v1/payments", protect(http.HandlerFunc(createPayment)))
	srv := httptest.NewServer(mux)
	return srv.URL, srv.Close
}

// The README's client: one logical call, its key generated.
func Example_readmeClient() {
	api, stop := paymentsAPI()
	defer stop()
	ctx := context.Background()
	// README
	c := idemclient.NewClient() // exported fields, like hashicorp/go-retryablehttp
	req, err := http.NewRequestWithContext(ctx, "POST", api+"/v1/payments", strings.NewReader(`{"amount_cents":1999}`))
	if err != nil {
		log.Fatal(err)
	}
	resp, err := c.Do(req) // one key (UUID v4) for every attempt
	if err != nil {
		log.Fatal(err) // an *idemclient.Error carries the key, to resume the call later
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode, resp.Replayed, resp.Attempts, len(resp.Key))
	// README

	// Output:
	// 201 false 1 36
}

// The README's standard client with a key of the application's: the second
// call is the same logical call, so it is replayed.
func Example_readmeStandardClientWithKey() {
	api, stop := paymentsAPI()
	defer stop()
	ctx := context.Background()
	// README
	hc := idemclient.NewClient().StandardClient() // an *http.Client for code that wants one
	// The key is saved with the order: after a crash, the retry is the same logical call.
	ctx = idemclient.WithKey(ctx, "order-1001")
	for range 2 {
		req, err := http.NewRequestWithContext(ctx, "POST", api+"/v1/payments", strings.NewReader(`{"amount_cents":1999}`))
		if err != nil {
			log.Fatal(err)
		}
		resp, err := hc.Do(req)
		if err != nil {
			log.Fatal(err)
		}
		resp.Body.Close()
		fmt.Println(resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true") // 201 false, then 201 true
	}
	// README

	// Output:
	// 201 false
	// 201 true
}

// The README's "Plain functions": a webhook receiver credits an event once
// however often the provider delivers it.
func Example_readmePlainFunctions() {
	store := idemmem.New(nil) // idemsqlite, idempgx or idemredis in production
	// README
	guard := idem.NewGuard(store, nil)
	ctx := context.Background()

	type Event struct {
		ID      string `json:"id"`
		Account string `json:"account"`
		Cents   int    `json:"amount_cents"`
		Attempt int    `json:"delivery_attempt"` // changes on every redelivery
	}
	credit := func(ctx context.Context, e Event) (string, error) {
		fmt.Println("crediting", e.Account, e.Cents)
		return "credit_1", nil
	}
	for attempt := 1; attempt <= 3; attempt++ { // the provider delivers the event three times
		e := Event{ID: "evt_123", Account: "acct_9", Cents: 500, Attempt: attempt}
		id, err := idem.Do(ctx, guard, e.ID, "webhook payment.succeeded", e,
			func(ctx context.Context) (string, error) { return credit(ctx, e) },
			idem.WithScope("provider-x"),
			idem.WithFingerprint(idem.FingerprintConfig{Exclude: []string{"delivery_attempt"}}))
		fmt.Println(id, err)
	}
	// README

	// Output:
	// crediting acct_9 500
	// credit_1 <nil>
	// credit_1 <nil>
	// credit_1 <nil>
}

// chargeOrder is the application's, in the README's message consumer.
func chargeOrder(ctx context.Context, order []byte) error { return nil }

// The README's "Message consumers (NATS JetStream)" (compiled, not run: it
// needs a NATS server and opens ./idem.db; idemnats's tests run the same).
func Example_readmeNATS() {
	// README
	store, err := idemsqlite.Open("idem.db", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		log.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "billing", // the records' endpoint is "nats ORDERS/billing"
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   time.Minute, // longer than a charge usually takes
	})
	if err != nil {
		log.Fatal(err)
	}
	billing := idemnats.New(store, func(ctx context.Context, msg jetstream.Msg) error {
		return chargeOrder(ctx, msg.Data()) // an error naks the message: it runs again, after a backoff
	}, &idemnats.Config{Conn: nc}) // terminations carry their reason (nats-server 2.10.4 and later)
	cc, err := cons.Consume(billing.Handle)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()

	// The producer names each message; a retried publish keeps the name.
	_, err = js.Publish(ctx, "orders.created", []byte(`{"order":42,"cents":500}`), jetstream.WithMsgID("order-42"))
	if err != nil {
		log.Fatal(err)
	}
	<-ctx.Done()
	// README
}

// The README's "Message consumers (RabbitMQ)": the billing consumer of the
// payments service's payment.succeeded events (compiled, not run: it needs
// RabbitMQ and opens ./billing.db; TestPipelineKills in
// cmd/idem/internal/e2e runs the same consumer under SIGKILL).
func Example_readmeAMQP() {
	// README
	store, err := idemsqlite.Open("billing.db", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	_, err = store.DB().Exec(`CREATE TABLE IF NOT EXISTS billed (
		event_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents INTEGER NOT NULL)`)
	if err != nil {
		log.Fatal(err)
	}
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	// The work queue "billing", its delay and dead-letter queues, and its
	// binding to the exchange `idem payments --events amqp://…` publishes to.
	if err := idemamqp.Declare(ctx, conn, "billing", nil); err != nil {
		log.Fatal(err)
	}
	ch, err := conn.Channel()
	if err != nil {
		log.Fatal(err)
	}
	err = ch.ExchangeDeclare("payments", amqp.ExchangeTopic, true, false, false, false, nil)
	if err == nil {
		err = ch.QueueBind("billing", "payment.succeeded", "payments", false, nil)
	}
	if err != nil {
		log.Fatal(err)
	}
	ch.Close()

	billing := idemamqp.New(conn, "billing", store, func(ctx context.Context, d *amqp.Delivery) error {
		var ev struct {
			ID          string `json:"id"`
			PaymentID   string `json:"payment_id"`
			AmountCents int64  `json:"amount_cents"`
		}
		if err := json.Unmarshal(d.Body, &ev); err != nil {
			return err // requeued; past the delivery limit, dead-lettered
		}
		tx, err := idemsqlite.TxFromContext(ctx) // commits with the event's record
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO billed VALUES (?, ?, ?)`, ev.ID, ev.PaymentID, ev.AmountCents)
		return err
	}, &idemamqp.Config{Guard: idem.GuardConfig{Transactional: true}})
	defer billing.Close()
	if err := billing.Run(ctx); err != nil { // until Ctrl-C
		log.Fatal(err)
	}
	// README
}
