package idemamqp_test

import (
	"context"
	"log"
	"os"
	"os/signal"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemsqlite"
)

// A RabbitMQ consumer whose handler runs at most once per message-id, on
// the embedded SQLite store: Declare makes the work queue (a quorum queue
// with a delivery limit), its delay queue and its dead-letter queue, and Run
// consumes until the context ends. (It needs a RabbitMQ broker, so it is
// compiled, not run, by go test.)
func Example() {
	store, err := idemsqlite.Open("idem.db", nil)
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close()
	conn, err := amqp.Dial("amqp://guest:guest@127.0.0.1:5672/")
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()

	if err := idemamqp.Declare(ctx, conn, "shipping", nil); err != nil {
		log.Fatal(err)
	}
	shipper := idemamqp.New(conn, "shipping", store, func(ctx context.Context, d *amqp.Delivery) error {
		return ship(ctx, d.Body) // acked only once its outcome is stored
	}, nil)
	defer shipper.Close()
	if err := shipper.Run(ctx); err != nil && ctx.Err() == nil {
		log.Fatal(err)
	}
}

func ship(context.Context, []byte) error { return nil }
