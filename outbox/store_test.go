package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/idem-dev/idem/internal/migrate"
)

func TestEnqueue(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		t.Run("committed", func(t *testing.T) {
			m := message("k-committed")
			m.Payload = []byte(`{ "reference": "order-1",  "amount_cents": 1250 }`)
			id := b.mustEnqueue(t, m)
			got := b.get(t, id)
			if got.ID != id || got.Topic != m.Topic || got.IdempotencyKey != m.IdempotencyKey {
				t.Errorf("got %+v, want the enqueued message", got)
			}
			var gotPayload, wantPayload map[string]any
			json.Unmarshal(got.Payload, &gotPayload)
			json.Unmarshal(m.Payload, &wantPayload)
			if !reflect.DeepEqual(gotPayload, wantPayload) {
				t.Errorf("payload %s, want %s", got.Payload, m.Payload)
			}
			now := b.clock.Now()
			if got.State != StatePending || got.Attempts != 0 || !got.ClaimedUntil.IsZero() || got.LastError != "" {
				t.Errorf("got %+v, want pending, unattempted, unclaimed", got)
			}
			if !got.AvailableAt.Equal(now) || !got.CreatedAt.Equal(now) || !got.UpdatedAt.Equal(now) {
				t.Errorf("times %v %v %v, want all %v", got.AvailableAt, got.CreatedAt, got.UpdatedAt, now)
			}
		})
		t.Run("rolled back", func(t *testing.T) {
			before := counts(t, b)
			if _, err := b.enqueue(t, false, message("k-rolled-back")); err != nil {
				t.Fatal(err)
			}
			if after := counts(t, b); !reflect.DeepEqual(before, after) {
				t.Errorf("counts %v after a rolled back enqueue, want %v", after, before)
			}
			// The key is free: the rolled back row never existed.
			b.mustEnqueue(t, message("k-rolled-back"))
		})
		t.Run("duplicate", func(t *testing.T) {
			b.mustEnqueue(t, message("k-dup"))
			if _, err := b.enqueue(t, true, message("k-dup")); !errors.Is(err, ErrDuplicate) {
				t.Errorf("second Enqueue: %v, want ErrDuplicate", err)
			}
			other := message("k-dup")
			other.Topic = "provider.refund"
			if _, err := b.enqueue(t, true, other); err != nil {
				t.Errorf("same key on another topic: %v", err)
			}
		})
		t.Run("invalid", func(t *testing.T) {
			for name, mod := range map[string]func(*Message){
				"no topic":     func(m *Message) { m.Topic = "" },
				"long topic":   func(m *Message) { m.Topic = strings.Repeat("t", MaxTopicLength+1) },
				"no key":       func(m *Message) { m.IdempotencyKey = "" },
				"long key":     func(m *Message) { m.IdempotencyKey = strings.Repeat("k", MaxKeyLength+1) },
				"no payload":   func(m *Message) { m.Payload = nil },
				"bad payload":  func(m *Message) { m.Payload = []byte(`{"a":`) },
				"text payload": func(m *Message) { m.Payload = []byte(`hello`) },
			} {
				m := message("k-invalid")
				mod(&m)
				if _, err := b.enqueue(t, true, m); !errors.Is(err, ErrInvalidMessage) {
					t.Errorf("%s: %v, want ErrInvalidMessage", name, err)
				}
			}
		})
	})
}

func TestEnqueueAvailableLater(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		m := message("k-later")
		m.AvailableAt = b.clock.Now().Add(time.Hour)
		id := b.mustEnqueue(t, m)
		if got := b.claim(t, 10); len(got) != 0 {
			t.Fatalf("claimed %d messages before they were due", len(got))
		}
		b.clock.Advance(time.Hour)
		got := b.claim(t, 10)
		if len(got) != 1 || got[0].ID != id {
			t.Fatalf("claimed %v, want message %d once due", got, id)
		}
	})
}

func TestClaim(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		now := b.clock.Now()
		var ids []int64
		// Enqueued in reverse due order: claims come in due order.
		for i := range 5 {
			m := message(fmt.Sprint("k-", i))
			m.AvailableAt = now.Add(-time.Duration(i) * time.Second)
			ids = append(ids, b.mustEnqueue(t, m))
		}
		first := b.claim(t, 3)
		if got, want := idsOf(first), []int64{ids[4], ids[3], ids[2]}; !reflect.DeepEqual(got, want) {
			t.Fatalf("first claim %v, want %v (due order, bounded)", got, want)
		}
		for _, m := range first {
			if m.Attempts != 1 || !m.ClaimedUntil.Equal(now.Add(time.Minute)) || m.State != StatePending {
				t.Errorf("claimed %+v, want attempt 1 claimed until %v", m, now.Add(time.Minute))
			}
		}
		second := b.claim(t, 10)
		if got, want := idsOf(second), []int64{ids[1], ids[0]}; !reflect.DeepEqual(got, want) {
			t.Fatalf("second claim %v, want the unclaimed rest %v", got, want)
		}
		if got := b.claim(t, 10); len(got) != 0 {
			t.Fatalf("claimed %v while every message is claimed", idsOf(got))
		}

		// A claim that expires (its relay died) is taken over, and the
		// takeover is another attempt.
		b.clock.Advance(time.Minute)
		third := b.claim(t, 10)
		if len(third) != 5 {
			t.Fatalf("claimed %d after the claims expired, want 5", len(third))
		}
		for _, m := range third {
			if m.Attempts != 2 {
				t.Errorf("message %d: attempts %d after a takeover, want 2", m.ID, m.Attempts)
			}
		}
		// The first relay's late outcome changes nothing.
		err := b.store.MessageFinish(b.ctx, &FinishParams{ID: first[0].ID, Attempt: 1, State: StateDone})
		if !errors.Is(err, ErrClaimLost) {
			t.Errorf("stale MessageFinish: %v, want ErrClaimLost", err)
		}
		if got := b.get(t, first[0].ID); got.State != StatePending || got.Attempts != 2 {
			t.Errorf("after a stale finish: %+v", got)
		}
	})
}

func TestFinish(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		for range 3 {
			b.mustEnqueue(t, message(fmt.Sprint("k-", b.clock.Now().UnixNano())))
			b.clock.Advance(time.Millisecond)
		}
		msgs := b.claim(t, 3)
		done, retry, dead := msgs[0], msgs[1], msgs[2]
		b.clock.Advance(time.Second)
		now := b.clock.Now()

		finish := func(m *Message, st State, avail time.Time, lastErr string) {
			t.Helper()
			err := b.store.MessageFinish(b.ctx, &FinishParams{ID: m.ID, Attempt: m.Attempts, State: st,
				AvailableAt: avail, LastError: lastErr, Now: now})
			if err != nil {
				t.Fatalf("MessageFinish(%d, %s): %v", m.ID, st, err)
			}
		}
		finish(done, StateDone, time.Time{}, "")
		finish(retry, StatePending, now.Add(time.Minute), "provider answered 503")
		finish(dead, StateDead, time.Time{}, "provider answered 400")

		if got := b.get(t, done.ID); got.State != StateDone || !got.ClaimedUntil.IsZero() || !got.UpdatedAt.Equal(now) {
			t.Errorf("done: %+v", got)
		}
		got := b.get(t, retry.ID)
		if got.State != StatePending || !got.ClaimedUntil.IsZero() || !got.AvailableAt.Equal(now.Add(time.Minute)) ||
			got.LastError != "provider answered 503" || got.Attempts != 1 {
			t.Errorf("retry: %+v", got)
		}
		if got := b.get(t, dead.ID); got.State != StateDead || got.LastError != "provider answered 400" {
			t.Errorf("dead: %+v", got)
		}
		// Finishing twice: the claim is gone.
		err := b.store.MessageFinish(b.ctx, &FinishParams{ID: done.ID, Attempt: done.Attempts, State: StateDead})
		if !errors.Is(err, ErrClaimLost) {
			t.Errorf("second MessageFinish: %v, want ErrClaimLost", err)
		}
		// An unclaimed message cannot be finished either.
		err = b.store.MessageFinish(b.ctx, &FinishParams{ID: retry.ID, Attempt: retry.Attempts, State: StateDone})
		if !errors.Is(err, ErrClaimLost) {
			t.Errorf("MessageFinish of an unclaimed message: %v, want ErrClaimLost", err)
		}
		if err := b.store.MessageFinish(b.ctx, &FinishParams{ID: retry.ID, State: "bogus"}); err == nil {
			t.Error("MessageFinish to an invalid state succeeded")
		}

		// The retry is due a minute later, claimed as attempt 2.
		if got := b.claim(t, 10); len(got) != 0 {
			t.Fatalf("claimed %v before the retry was due", idsOf(got))
		}
		b.clock.Advance(time.Minute)
		again := b.claim(t, 10)
		if len(again) != 1 || again[0].ID != retry.ID || again[0].Attempts != 2 || again[0].LastError != "provider answered 503" {
			t.Fatalf("claimed %+v, want the retry as attempt 2", again)
		}

		if c := counts(t, b); c[StatePending] != 1 || c[StateDone] != 1 || c[StateDead] != 1 {
			t.Errorf("counts %v", c)
		}
	})
}

func TestUnclaim(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		id := b.mustEnqueue(t, message("k"))
		m := b.claim(t, 1)[0]
		if err := b.store.MessageUnclaim(b.ctx, &UnclaimParams{ID: id, Attempt: m.Attempts}); err != nil {
			t.Fatal(err)
		}
		if got := b.get(t, id); got.Attempts != 0 || !got.ClaimedUntil.IsZero() {
			t.Errorf("after unclaim: %+v", got)
		}
		if err := b.store.MessageUnclaim(b.ctx, &UnclaimParams{ID: id, Attempt: m.Attempts}); !errors.Is(err, ErrClaimLost) {
			t.Errorf("second unclaim: %v, want ErrClaimLost", err)
		}
		if got := b.claim(t, 1); len(got) != 1 || got[0].Attempts != 1 {
			t.Errorf("claim after unclaim: %+v", got)
		}
	})
}

func TestRedriveAndPrune(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		deadID := b.mustEnqueue(t, message("k-dead"))
		doneID := b.mustEnqueue(t, message("k-done"))
		for _, m := range b.claim(t, 2) {
			st := StateDone
			if m.ID == deadID {
				st = StateDead
			}
			if err := b.store.MessageFinish(b.ctx, &FinishParams{ID: m.ID, Attempt: m.Attempts, State: st, LastError: "x"}); err != nil {
				t.Fatal(err)
			}
		}
		if err := b.store.MessageRedrive(b.ctx, doneID); !errors.Is(err, ErrNotFound) {
			t.Errorf("redrive of a done message: %v, want ErrNotFound", err)
		}
		b.clock.Advance(time.Hour)
		if err := b.store.MessageRedrive(b.ctx, deadID); err != nil {
			t.Fatal(err)
		}
		got := b.get(t, deadID)
		if got.State != StatePending || got.Attempts != 0 || !got.AvailableAt.Equal(b.clock.Now()) {
			t.Errorf("redriven: %+v", got)
		}
		if _, err := b.store.MessageGet(b.ctx, 1<<40); !errors.Is(err, ErrNotFound) {
			t.Errorf("MessageGet of a missing id: %v, want ErrNotFound", err)
		}

		// Pruning keeps done messages updated at or after Before.
		doneAt := b.get(t, doneID).UpdatedAt
		if n, err := b.store.MessagePrune(b.ctx, &PruneParams{Before: doneAt}); err != nil || n != 0 {
			t.Errorf("MessagePrune(before the message) = %d, %v; want 0", n, err)
		}
		if n, err := b.store.MessagePrune(b.ctx, &PruneParams{Before: doneAt.Add(time.Microsecond)}); err != nil || n != 1 {
			t.Errorf("MessagePrune = %d, %v; want 1", n, err)
		}
		if _, err := b.store.MessageGet(b.ctx, doneID); !errors.Is(err, ErrNotFound) {
			t.Errorf("pruned message: %v, want ErrNotFound", err)
		}
		if c := counts(t, b); !reflect.DeepEqual(c, map[State]int{StatePending: 1}) {
			t.Errorf("counts %v, want only the redriven message", c)
		}
	})
}

func TestConstraints(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		id := b.mustEnqueue(t, message("k"))
		for _, q := range []string{
			"UPDATE idem_outbox SET state = 'bogus' WHERE id = %d",
			"UPDATE idem_outbox SET attempts = -1 WHERE id = %d",
			"UPDATE idem_outbox SET topic = '' WHERE id = %d",
			"UPDATE idem_outbox SET idempotency_key = '' WHERE id = %d",
			"UPDATE idem_outbox SET state = 'done', claimed_until = available_at WHERE id = %d",
		} {
			if err := b.exec(fmt.Sprintf(q, id)); err == nil {
				t.Errorf("%s: succeeded, want a CHECK violation", q)
			} else if !strings.Contains(err.Error(), "check") && !strings.Contains(err.Error(), "CHECK") {
				t.Errorf("%s: %v, want a CHECK violation", q, err)
			}
		}
	})
}

func TestMigrations(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		status, err := b.migrator.MigrationStatus(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range status {
			if !m.Applied || !m.AppliedAt.Equal(epoch) {
				t.Errorf("migration %03d_%s: applied %v at %v, want applied at %v", m.Version, m.Name, m.Applied, m.AppliedAt, epoch)
			}
		}
		if again, err := b.migrator.Migrate(b.ctx); err != nil || len(again) != 0 {
			t.Errorf("second Migrate applied %v, %v; want nothing", again, err)
		}
		b.mustEnqueue(t, message("k"))

		for i := len(status) - 1; i >= 0; i-- {
			m, err := b.migrator.MigrateDown(b.ctx)
			if err != nil || m == nil || m.Version != status[i].Version {
				t.Fatalf("MigrateDown = %v, %v; want version %d", m, err, status[i].Version)
			}
		}
		if m, err := b.migrator.MigrateDown(b.ctx); err != nil || m != nil {
			t.Errorf("MigrateDown with none applied = %v, %v", m, err)
		}
		if _, err := b.store.MessageCounts(b.ctx); err == nil {
			t.Error("the outbox table survived the down migrations")
		}
		status, err = b.migrator.MigrationStatus(b.ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range status {
			if m.Applied {
				t.Errorf("migration %03d still applied", m.Version)
			}
		}
		if done, err := b.migrator.Migrate(b.ctx); err != nil || len(done) != len(status) {
			t.Fatalf("Migrate after down applied %d, %v; want %d", len(done), err, len(status))
		}
		if c := counts(t, b); len(c) != 0 {
			t.Errorf("counts %v on a fresh table", c)
		}
	})
}

func TestLoadMigrations(t *testing.T) {
	t.Parallel()
	for _, ms := range [][]migrate.Migration{postgresMigrations, sqliteMigrations, mysqlMigrations} {
		if len(ms) == 0 || ms[0].Version != 1 {
			t.Fatalf("migrations %v", ms)
		}
	}
	if len(postgresMigrations) != len(sqliteMigrations) || len(postgresMigrations) != len(mysqlMigrations) {
		t.Errorf("%d postgres migrations, %d sqlite, %d mysql: the dialects must move together",
			len(postgresMigrations), len(sqliteMigrations), len(mysqlMigrations))
	}
	for i := range postgresMigrations {
		if postgresMigrations[i].Name != sqliteMigrations[i].Name || postgresMigrations[i].Name != mysqlMigrations[i].Name {
			t.Errorf("migration %d: %s on postgres, %s on sqlite, %s on mysql", i+1,
				postgresMigrations[i].Name, sqliteMigrations[i].Name, mysqlMigrations[i].Name)
		}
	}
}

func TestConcurrentClaims(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const rows, claimers = 200, 8
		b.mustEnqueueAll(t, messages(rows)...)
		var (
			mu      sync.Mutex
			claimed = make(map[int64]int)
			wg      sync.WaitGroup
			start   = make(chan struct{})
		)
		for range claimers {
			s := b.newStore(t)
			wg.Go(func() {
				<-start
				for {
					now := b.clock.Now()
					msgs, err := s.MessageClaim(b.ctx, &ClaimParams{Limit: 7, Now: now, ClaimedUntil: now.Add(time.Hour)})
					if err != nil {
						t.Error(err)
						return
					}
					if len(msgs) == 0 {
						return
					}
					mu.Lock()
					for _, m := range msgs {
						claimed[m.ID]++
					}
					mu.Unlock()
				}
			})
		}
		close(start)
		wg.Wait()
		if len(claimed) != rows {
			t.Errorf("%d messages claimed, want %d", len(claimed), rows)
		}
		for id, n := range claimed {
			if n != 1 {
				t.Errorf("message %d claimed %d times", id, n)
			}
		}
	})
}

func idsOf(msgs []*Message) []int64 {
	out := make([]int64, len(msgs))
	for i, m := range msgs {
		out[i] = m.ID
	}
	return out
}

func counts(t *testing.T, b *bundle) map[State]int {
	t.Helper()
	c, err := b.store.MessageCounts(b.ctx)
	if err != nil {
		t.Fatalf("MessageCounts: %v", err)
	}
	return c
}

// TestPgxSchema: a configured schema is created by Migrate and holds the
// tables, whatever the search_path says; its name is quoted.
func TestPgxSchema(t *testing.T) {
	t.Parallel()
	pool := newPgxPool(t) // its search_path names another schema
	b := make([]byte, 4)
	rand.Read(b)
	schema := "Outbox Schema " + hex.EncodeToString(b)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{schema}.Sanitize()+" CASCADE"); err != nil {
			t.Errorf("dropping schema: %v", err)
		}
	})
	ctx := context.Background()
	s := NewPgx(pool, &Config{Schema: schema})
	if _, err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	id, err := s.Enqueue(ctx, tx, message("k"))
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	msgs, err := s.MessageClaim(ctx, &ClaimParams{Now: now, ClaimedUntil: now.Add(time.Minute)})
	if err != nil || len(msgs) != 1 || msgs[0].ID != id {
		t.Fatalf("MessageClaim = %v, %v", msgs, err)
	}
	for table, want := range map[string]bool{
		pgx.Identifier{schema, "idem_outbox"}.Sanitize():            true,
		pgx.Identifier{schema, "idem_outbox_migrations"}.Sanitize(): true,
		"idem_outbox": false, // not in the search_path's schema
	} {
		var got *string
		if err := pool.QueryRow(ctx, "SELECT to_regclass($1)::text", table).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if (got != nil) != want {
			t.Errorf("table %s exists: %v, want %v", table, got != nil, want)
		}
	}
	status, err := s.MigrationStatus(ctx)
	if err != nil || !status[0].Applied {
		t.Errorf("MigrationStatus = %+v, %v", status, err)
	}
}

func TestList(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		ids := b.mustEnqueueAll(t, messages(5)...)
		// Kill messages 1 and 3.
		for _, m := range b.claim(t, 5) {
			if m.ID == ids[1] || m.ID == ids[3] {
				if err := b.store.MessageFinish(b.ctx, &FinishParams{ID: m.ID, Attempt: m.Attempts, State: StateDead, LastError: "x"}); err != nil {
					t.Fatal(err)
				}
			} else if err := b.store.MessageUnclaim(b.ctx, &UnclaimParams{ID: m.ID, Attempt: m.Attempts}); err != nil {
				t.Fatal(err)
			}
		}
		list := func(p ListParams) []int64 {
			t.Helper()
			msgs, err := b.store.MessageList(b.ctx, &p)
			if err != nil {
				t.Fatalf("MessageList(%+v): %v", p, err)
			}
			return idsOf(msgs)
		}
		if got, want := list(ListParams{State: StateDead}), []int64{ids[1], ids[3]}; !reflect.DeepEqual(got, want) {
			t.Errorf("dead: %v, want %v", got, want)
		}
		if got, want := list(ListParams{State: StatePending, Limit: 2}), []int64{ids[0], ids[2]}; !reflect.DeepEqual(got, want) {
			t.Errorf("first pending page: %v, want %v", got, want)
		}
		if got, want := list(ListParams{State: StatePending, AfterID: ids[2], Limit: 2}), []int64{ids[4]}; !reflect.DeepEqual(got, want) {
			t.Errorf("second pending page: %v, want %v", got, want)
		}
		if got := list(ListParams{}); !reflect.DeepEqual(got, ids) {
			t.Errorf("all: %v, want %v", got, ids)
		}
		if got := list(ListParams{State: StateDone}); len(got) != 0 {
			t.Errorf("done: %v, want none", got)
		}
	})
}
