package idemnats_test

import (
	"context"
	"log"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemsqlite"
)

// A JetStream consumer whose handler runs at most once per Nats-Msg-Id,
// on the embedded SQLite store. (It needs a NATS server with JetStream, so
// it is compiled, not run, by go test.)
func Example() {
	ctx := context.Background()
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
	cons, err := js.CreateOrUpdateConsumer(ctx, "ORDERS", jetstream.ConsumerConfig{
		Durable:   "shipper",
		AckPolicy: jetstream.AckExplicitPolicy, // idemnats acks only once the outcome is stored
	})
	if err != nil {
		log.Fatal(err)
	}

	shipper := idemnats.New(store, func(ctx context.Context, msg jetstream.Msg) error {
		return ship(ctx, msg.Data()) // runs at most once per message id
	}, nil)
	cc, err := cons.Consume(shipper.Handle)
	if err != nil {
		log.Fatal(err)
	}
	defer cc.Stop()
	<-ctx.Done()
}

func ship(context.Context, []byte) error { return nil }
