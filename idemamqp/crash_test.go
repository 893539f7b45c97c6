package idemamqp_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemamqp"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// crashChildEnv tells a re-executed test binary to be
// TestConsumerKilledChild: "SPEC|QUEUE|MODE|RUNS", the store to open (see
// testDB.spec), the queue it consumes with Run, "plain" or "tx", and the
// file each handler run appends a line to.
const (
	crashChildEnv = "IDEMAMQP_TEST_CRASH_CHILD"
	crashStarted  = "idemamqp-crash-child: effect done"
)

// TestConsumerKilled: a consumer process (Run) is SIGKILLed in the middle
// of a message, after its effect (a ledger row in the store's database);
// its connection drops and RabbitMQ returns the message to the queue, which
// delivers it to a consumer in the test process, on the same store.
//
// Outside a transaction the effect is committed when the process dies. The
// redelivery finds the record in progress while the dead attempt's lease
// lasts (to the delay queue), then unknown once the test clock passes it
// (held: to the delay queue, again and again); the handler never runs
// again and the ledger has one row.
//
// In transactional mode the row was written in the attempt's transaction,
// which died with the process. The redelivery finds the record in progress
// while the lease lasts, then released: it runs the handler, whose row
// commits with the completion, and the message is acked. The ledger has one
// row, though the handler ran twice.
func TestConsumerKilled(t *testing.T) {
	t.Parallel()
	for _, kind := range storeKinds {
		for _, mode := range []string{"plain", "tx"} {
			t.Run(kind+"/"+mode, func(t *testing.T) {
				t.Parallel()
				b := setup(t, kind, 0)
				runs := filepath.Join(t.TempDir(), "runs")
				b.publish(t, `{"account":"acct-9","cents":900}`, withID("pay-9"))

				child := crashChildEnv + "=" + strings.Join([]string{b.db.spec, b.queue, mode, runs}, "|")
				testenv.KillChild(t, "TestConsumerKilledChild", []string{child}, crashStarted)

				// The surviving consumer, on the same store and a clock
				// the test drives.
				clock := newClock()
				db := openDB(t, b.db.spec, clock.Now)
				cfg := config(clock, nil)
				cfg.Guard.Lease = 30 * time.Second
				cfg.Guard.Transactional = mode == "tx"
				c := b.newConsumer(t, db.store, crashHandler(db, mode, runs), cfg)

				d := b.process(t, c, idemamqp.OutcomeInProgress)
				if !d.Redelivered || d.Headers["x-delivery-count"] != int64(1) {
					t.Fatalf("redelivered %v, x-delivery-count %v; want RabbitMQ's return of the dead consumer's message", d.Redelivered, d.Headers["x-delivery-count"])
				}
				clock.Advance(31 * time.Second) // the dead attempt's lease ends
				if mode == "plain" {
					for range 3 {
						process := b.process(t, c, idemamqp.OutcomeUnknown)
						if process.Headers[idemamqp.HeaderReturns] != int64(1) {
							t.Fatalf("the held copy counts %v returns, want 1", process.Headers[idemamqp.HeaderReturns])
						}
					}
					if rec := getRecord(t, db.store, endpoint(b.queue), "pay-9"); rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
						t.Fatalf("record: %s after %d attempts; want unknown after 1", rec.State, rec.Attempts)
					}
					if n := countRuns(t, runs); n != 1 {
						t.Fatalf("the handler ran %d times, want once (in the killed process)", n)
					}
				} else {
					b.process(t, c, idemamqp.OutcomeCompleted)
					b.settled(t)
					if rec := getRecord(t, db.store, endpoint(b.queue), "pay-9"); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
						t.Fatalf("record: %s after %d attempts; want completed after 2", rec.State, rec.Attempts)
					}
					if n := countRuns(t, runs); n != 2 {
						t.Fatalf("the handler ran %d times, want twice (killed, then redelivered)", n)
					}
				}
				if n := db.rows(t); n != 1 {
					t.Fatalf("%d ledger rows, want one effect", n)
				}
			})
		}
	}
}

// crashHandler appends a line to runs, then writes the message's ledger
// row: in the attempt's transaction in mode "tx", committed at once in
// mode "plain".
func crashHandler(db *testDB, mode, runs string) idemamqp.Handler {
	return func(ctx context.Context, d *amqp.Delivery) error {
		f, err := os.OpenFile(runs, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		fmt.Fprintln(f, "ran")
		if err := f.Close(); err != nil {
			return err
		}
		if mode == "tx" {
			return db.record(ctx, msgID(d))
		}
		return db.recordNow(ctx, msgID(d))
	}
}

func countRuns(t *testing.T, runs string) int {
	t.Helper()
	b, err := os.ReadFile(runs)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(string(b), "ran\n")
}

// TestConsumerKilledChild is the consumer process TestConsumerKilled
// kills: it does the message's effect, says so and hangs.
func TestConsumerKilledChild(t *testing.T) {
	env := os.Getenv(crashChildEnv)
	if env == "" {
		t.Skip("run by TestConsumerKilled in a child process")
	}
	parts := strings.Split(env, "|")
	if len(parts) != 4 {
		t.Fatalf("%s=%q", crashChildEnv, env)
	}
	spec, queue, mode, runs := parts[0], parts[1], parts[2], parts[3]
	db := openDB(t, spec, time.Now)
	conn := connect(t)
	effect := crashHandler(db, mode, runs)
	c := idemamqp.New(conn, queue, db.store, func(ctx context.Context, d *amqp.Delivery) error {
		if err := effect(ctx, d); err != nil {
			t.Error(err)
			return err
		}
		fmt.Println(crashStarted)
		time.Sleep(2 * time.Minute) // until killed
		return nil
	}, &idemamqp.Config{Guard: idem.GuardConfig{Lease: 30 * time.Second, Transactional: mode == "tx", Logger: config(newClock(), nil).Guard.Logger}})
	if err := c.Run(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Fatal("the child was not killed")
}
