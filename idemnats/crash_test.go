package idemnats_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemnats"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// crashChildEnv tells a re-executed test binary to be
// TestConsumerKilledChild: "SPEC|STREAM|MODE|RUNS", the store to open (see
// testDB.spec), the stream whose consumer "worker" it joins, "plain" or
// "tx", and the file each handler run appends a line to.
const (
	crashChildEnv = "IDEMNATS_TEST_CRASH_CHILD"
	crashStarted  = "idemnats-crash-child: effect done"
)

// TestConsumerKilled: a consumer process is SIGKILLed in the middle of a
// message, after its effect (a ledger row in the store's database), and
// JetStream redelivers the message (AckWait one second) to a consumer in
// the test process, on the same store.
//
// Outside a transaction the effect is committed when the process dies. The
// redelivery finds the record in progress while the dead attempt's lease
// lasts (nak with delay), then unknown once the test clock passes it (held:
// nak with delay, again and again); the handler never runs again and the
// ledger has one row.
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
				_, js := connect(t)
				stream := newStream(t, js, nil)
				cons := durable(t, js, stream, time.Second)
				db := newDB(t, kind, time.Now)
				runs := filepath.Join(t.TempDir(), "runs")
				publish(t, js, stream+".payments", `{"account":"acct-9","cents":900}`, jetstream.MsgIDHeader, "pay-9")

				child := crashChildEnv + "=" + strings.Join([]string{db.spec, stream, mode, runs}, "|")
				testenv.KillChild(t, "TestConsumerKilledChild", []string{child}, crashStarted)

				// The surviving consumer, on the same store and a clock
				// the test drives.
				clock := newClock()
				db = openDB(t, db.spec, clock.Now)
				cfg := config(clock, nil)
				cfg.Guard.Lease = 30 * time.Second
				cfg.Guard.Transactional = mode == "tx"
				c := idemnats.New(db.store, crashHandler(db, mode, runs), cfg)

				m := process(t, c, cons, idemnats.OutcomeInProgress)
				if md, _ := m.Metadata(); md.NumDelivered != 2 {
					t.Fatalf("delivery %d, want JetStream's redelivery (2)", md.NumDelivered)
				}
				clock.Advance(31 * time.Second) // the dead attempt's lease ends
				if mode == "plain" {
					for range 3 {
						process(t, c, cons, idemnats.OutcomeUnknown)
					}
					if rec := getRecord(t, db.store, endpoint(stream), "pay-9"); rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
						t.Fatalf("record: %s after %d attempts; want unknown after 1", rec.State, rec.Attempts)
					}
					if n := countRuns(t, runs); n != 1 {
						t.Fatalf("the handler ran %d times, want once (in the killed process)", n)
					}
				} else {
					process(t, c, cons, idemnats.OutcomeCompleted)
					waitSettled(t, cons)
					if rec := getRecord(t, db.store, endpoint(stream), "pay-9"); rec.State != idemstore.StateCompleted || rec.Attempts != 2 {
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
func crashHandler(db *testDB, mode, runs string) idemnats.Handler {
	return func(ctx context.Context, m jetstream.Msg) error {
		f, err := os.OpenFile(runs, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		fmt.Fprintln(f, "ran")
		if err := f.Close(); err != nil {
			return err
		}
		if mode == "tx" {
			return db.record(ctx, msgID(m))
		}
		return db.recordNow(ctx, msgID(m))
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
	spec, stream, mode, runs := parts[0], parts[1], parts[2], parts[3]
	db := openDB(t, spec, time.Now)
	_, js := connect(t)
	cons, err := js.Consumer(context.Background(), stream, worker)
	if err != nil {
		t.Fatal(err)
	}
	effect := crashHandler(db, mode, runs)
	c := idemnats.New(db.store, func(ctx context.Context, m jetstream.Msg) error {
		if err := effect(ctx, m); err != nil {
			t.Error(err)
			return err
		}
		fmt.Println(crashStarted)
		time.Sleep(2 * time.Minute) // until killed
		return nil
	}, &idemnats.Config{Guard: idem.GuardConfig{Lease: 30 * time.Second, Transactional: mode == "tx", Logger: config(newClock(), nil).Guard.Logger}})
	if _, err := cons.Consume(c.Handle); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Minute)
	t.Fatal("the child was not killed")
}
