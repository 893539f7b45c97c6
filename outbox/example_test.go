package outbox_test

import (
	"context"
	"database/sql"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/idem-dev/idem/outbox"

	_ "modernc.org/sqlite"
)

// The business write and the message commit together; the relay delivers
// the message afterwards with its idempotency key.
func Example() {
	dir, _ := os.MkdirTemp("", "outbox-example")
	defer os.RemoveAll(dir)
	db, err := sql.Open("sqlite", filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=5000")
	if err != nil {
		log.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()

	store := outbox.NewSQLite(db, nil)
	if _, err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	db.ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, amount_cents INTEGER)`)

	tx, _ := db.BeginTx(ctx, nil)
	tx.ExecContext(ctx, `INSERT INTO payments (amount_cents) VALUES (1250)`)
	_, err = store.Enqueue(ctx, tx, outbox.Message{
		Topic:          "provider.charge",
		Payload:        []byte(`{"amount_cents":1250,"currency":"EUR"}`),
		IdempotencyKey: "idem-3f2a9c", // e.g. idem.DeriveKey(id, "charge")
	})
	if err != nil {
		log.Fatal(err)
	}
	tx.Commit()

	relay := outbox.NewRelay(store, &outbox.RelayConfig{
		Deliver: func(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
			fmt.Printf("POST /charges Idempotency-Key: %s %s\n", m.IdempotencyKey, m.Payload)
			return outbox.OutcomeDelivered, nil
		},
	})
	n, err := relay.RunOnce(ctx) // or relay.Start(ctx) and, at shutdown, relay.Stop()
	fmt.Println(n, err)
	// Output:
	// POST /charges Idempotency-Key: idem-3f2a9c {"amount_cents":1250,"currency":"EUR"}
	// 1 <nil>
}
