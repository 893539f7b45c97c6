package idempgx

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// setupWait returns a bundle whose store polls so rarely that a KeyWait
// returning within the test's bounds was woken by a notification.
func setupWait(t *testing.T, poll time.Duration) *bundle {
	t.Helper()
	clock := idemtest.NewClock(time.Now().UTC().Truncate(time.Second))
	s := newUnmigratedStore(t, clock.Now)
	s.cfg.WaitPoll = poll
	if _, err := s.Migrate(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return &bundle{store: s, clock: clock, ctx: t.Context()}
}

// waitFlagged waits until a KeyWait call marked id's record.
func (b *bundle) waitFlagged(t *testing.T, id idemstore.Identity) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var waiters bool
		err := b.store.pool.QueryRow(b.ctx,
			"SELECT waiters FROM "+b.store.schema+".idem_keys WHERE scope = $1 AND endpoint = $2 AND key = $3",
			id.Scope, id.Endpoint, id.Key).Scan(&waiters)
		if err != nil {
			t.Fatal(err)
		}
		if waiters {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("KeyWait did not mark the record within 10s")
}

// TestKeyWaitWakes: a request waiting for an in-progress record is woken by
// each write that finishes the attempt.
func TestKeyWaitWakes(t *testing.T) {
	t.Parallel()
	b := setupWait(t, time.Hour)
	finishers := []struct {
		name   string
		finish func(id idemstore.Identity, token string) error
	}{
		{"complete", func(id idemstore.Identity, token string) error {
			return b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: sampleResponse()})
		}},
		{"release", func(id idemstore.Identity, token string) error {
			return b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"mark unknown", func(id idemstore.Identity, token string) error {
			return b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"delete", func(id idemstore.Identity, token string) error {
			return b.store.KeyDelete(b.ctx, &idemstore.FinishParams{Identity: id, Token: token})
		}},
		{"sweep", func(id idemstore.Identity, token string) error {
			b.clock.Advance(lease)
			recs, err := b.store.KeySweep(b.ctx, &idemstore.SweepParams{})
			if err == nil && len(recs) != 1 {
				err = fmt.Errorf("swept %d records, want 1", len(recs))
			}
			return err
		}},
	}
	for i, f := range finishers {
		id := testID
		id.Key = fmt.Sprintf("key-%d", i)
		p := reserveParams("t1", idemstore.StateUnknown)
		p.Identity = id
		b.reserve(t, p)

		ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
		done := make(chan error, 1)
		go func() { done <- b.store.KeyWait(ctx, id) }()
		b.waitFlagged(t, id)
		if err := f.finish(id, "t1"); err != nil {
			t.Fatalf("%s: %v", f.name, err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%s: KeyWait: %v, want a wake-up", f.name, err)
		}
		cancel()
	}
}

// TestKeyWaitReturnsAtOnce: a record that is not in progress (or missing)
// needs no waiting.
func TestKeyWaitReturnsAtOnce(t *testing.T) {
	t.Parallel()
	b := setupWait(t, time.Hour)
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := b.store.KeyWait(ctx, testID); err != nil {
		t.Fatalf("KeyWait on a missing record: %v", err)
	}
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: testID, Token: "t1", Response: sampleResponse()}); err != nil {
		t.Fatal(err)
	}
	if err := b.store.KeyWait(ctx, testID); err != nil {
		t.Fatalf("KeyWait on a completed record: %v", err)
	}
}

// TestKeyWaitBounds: without a change KeyWait returns after WaitPoll, and
// with ctx's error when ctx ends first.
func TestKeyWaitBounds(t *testing.T) {
	t.Parallel()
	b := setupWait(t, 50*time.Millisecond)
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	ctx, cancel := context.WithTimeout(b.ctx, 20*time.Second)
	defer cancel()
	if err := b.store.KeyWait(ctx, testID); err != nil {
		t.Fatalf("KeyWait until the poll: %v", err)
	}

	b.store.cfg.WaitPoll = time.Hour
	ctx, cancel = context.WithCancel(b.ctx)
	done := make(chan error, 1)
	go func() { done <- b.store.KeyWait(ctx, testID) }()
	b.waitFlagged(t, testID)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("KeyWait after cancel: %v, want context.Canceled", err)
	}

	b.store.Close()
	b.store.Close()
	select {
	case <-b.store.notify.done:
	default:
		t.Fatal("the listener still runs after Close")
	}
	b.store.cfg.WaitPoll = 10 * time.Millisecond
	if err := b.store.KeyWait(b.ctx, testID); err != nil {
		t.Fatalf("KeyWait after Close: %v", err)
	}
}

// TestNotifyOnlyWaitedRecords: the finishing statements call pg_notify only
// for a record a request waits for.
func TestNotifyOnlyWaitedRecords(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// complete returns a row for the record it completed.
	complete := func(id idemstore.Identity) (changed, notified int64) {
		t.Helper()
		resp, err := encodeResponse(sampleResponse(), false)
		if err != nil {
			t.Fatal(err)
		}
		now := b.store.now()
		err = b.store.pool.QueryRow(b.ctx, b.store.q.complete, id.Scope, id.Endpoint, id.Key, "t1", now,
			resp.status, resp.header, resp.body, resp.notReplayable).Scan(&notified)
		if err != nil {
			t.Fatal(err)
		}
		return 1, notified
	}
	b.reserve(t, reserveParams("t1", idemstore.StateUnknown))
	if changed, notified := complete(testID); changed != 1 || notified != 0 {
		t.Fatalf("completion nobody waits for: changed %d, notified %d; want 1, 0", changed, notified)
	}

	other := testID
	other.Key = "key-2"
	p := reserveParams("t1", idemstore.StateUnknown)
	p.Identity = other
	b.reserve(t, p)
	var inProgress bool
	if err := b.store.pool.QueryRow(b.ctx, b.store.q.wait, other.Scope, other.Endpoint, other.Key, b.store.now()).Scan(&inProgress); err != nil || !inProgress {
		t.Fatalf("wait statement: %v, %v; want true", inProgress, err)
	}
	if changed, notified := complete(other); changed != 1 || notified != 1 {
		t.Fatalf("completion of a waited record: changed %d, notified %d; want 1, 1", changed, notified)
	}
	// A finished record is not waited for.
	if err := b.store.pool.QueryRow(b.ctx, b.store.q.wait, other.Scope, other.Endpoint, other.Key, b.store.now()).Scan(&inProgress); err != nil || inProgress {
		t.Fatalf("wait statement on a completed record: %v, %v; want false", inProgress, err)
	}
}

func TestNotifyPayloadMatchesSQL(t *testing.T) {
	t.Parallel()
	b := setup(t)
	for _, id := range []idemstore.Identity{testID, {Scope: "", Endpoint: "POST /x", Key: "é-ü"}, {Scope: "a:1", Endpoint: "b", Key: ""}} {
		var got string
		err := b.store.pool.QueryRow(b.ctx, "SELECT "+notifyPayloadSQL+" FROM (SELECT $1::text AS scope, $2::text AS endpoint, $3::text AS key) AS u",
			id.Scope, id.Endpoint, id.Key).Scan(&got)
		if err != nil {
			t.Fatal(err)
		}
		if want := notifyPayload(id); got != want {
			t.Errorf("%+v: SQL payload %s, Go payload %s", id, got, want)
		}
	}
}
