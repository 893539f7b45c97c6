package outbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// seed seeds every test relay's jitter, so expected waits can be replayed.
const seed = 42

// newRelay returns a relay on b's store and clock with a seeded jitter and
// logs in the test's output.
func newRelay(t *testing.T, b *bundle, cfg RelayConfig) *Relay {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = b.clock.Now
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.New(rand.NewPCG(seed, seed))
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.NewTextHandler(t.Output(), nil))
	}
	return NewRelay(b.store, &cfg)
}

// recorder is a Deliver hook that answers from a script and records calls.
type recorder struct {
	mu    sync.Mutex
	calls []Message
	// answer returns the outcome of the n-th call (from 0).
	answer func(n int, m Message) (Outcome, error)
}

func (d *recorder) deliver(ctx context.Context, m Message) (Outcome, error) {
	d.mu.Lock()
	n := len(d.calls)
	d.calls = append(d.calls, m)
	d.mu.Unlock()
	if d.answer == nil {
		return OutcomeDelivered, nil
	}
	return d.answer(n, m)
}

func (d *recorder) count() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.calls)
}

func (d *recorder) call(n int) Message {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.calls[n]
}

func runOnce(t *testing.T, b *bundle, r *Relay, want int) {
	t.Helper()
	n, err := r.RunOnce(b.ctx)
	if err != nil {
		t.Fatalf("RunOnce: %v", err)
	}
	if n != want {
		t.Fatalf("RunOnce attempted %d messages, want %d", n, want)
	}
}

func TestRelayDelivers(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver, BatchSize: 2})
		var ids []int64
		for i := range 3 {
			ids = append(ids, b.mustEnqueue(t, message(fmt.Sprint("k-", i))))
		}
		runOnce(t, b, r, 2) // bounded batch
		runOnce(t, b, r, 1)
		runOnce(t, b, r, 0)
		for i, id := range ids {
			m := d.call(i)
			if m.ID != id || m.IdempotencyKey != fmt.Sprint("k-", i) || m.Attempts != 1 || m.Topic != "provider.charge" {
				t.Errorf("call %d: %+v, want message %d, attempt 1", i, m, id)
			}
			if got := b.get(t, id); got.State != StateDone || got.Attempts != 1 || got.LastError != "" {
				t.Errorf("message %d: %+v, want done", id, got)
			}
		}
	})
}

// TestRelayBackoff drives the clock through every retry of a message that
// always fails: each wait is drawn with full jitter below a doubling cap,
// the message is not due a microsecond early, and it is dead-lettered after
// MaxAttempts.
func TestRelayBackoff(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{answer: func(int, Message) (Outcome, error) {
			return OutcomeRetry, errors.New("provider answered 503")
		}}
		backoff := Backoff{Base: time.Second, Max: 30 * time.Second}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver, Backoff: backoff})
		replay := rand.New(rand.NewPCG(seed, seed)) // draws what the relay draws
		id := b.mustEnqueue(t, message("k"))

		for attempt := 1; attempt < DefaultMaxAttempts; attempt++ {
			failedAt := b.clock.Now()
			runOnce(t, b, r, 1)
			m := b.get(t, id)
			wait := time.Duration(replay.Int64N(int64(backoff.Cap(attempt)) + 1))
			if m.State != StatePending || m.Attempts != attempt || !m.AvailableAt.Equal(micro(failedAt.Add(wait))) {
				t.Fatalf("after attempt %d: %+v, want pending, due at %v", attempt, m, failedAt.Add(wait))
			}
			if m.LastError != "retry: provider answered 503" {
				t.Errorf("last error %q", m.LastError)
			}
			if wait >= time.Microsecond {
				b.clock.Set(m.AvailableAt.Add(-time.Microsecond))
				runOnce(t, b, r, 0)
			}
			b.clock.Set(m.AvailableAt)
		}
		runOnce(t, b, r, 1)
		m := b.get(t, id)
		if m.State != StateDead || m.Attempts != DefaultMaxAttempts {
			t.Fatalf("after %d attempts: %+v, want dead", DefaultMaxAttempts, m)
		}
		if d.count() != DefaultMaxAttempts {
			t.Errorf("Deliver called %d times, want %d", d.count(), DefaultMaxAttempts)
		}
		b.clock.Advance(time.Hour)
		runOnce(t, b, r, 0)
	})
}

func TestBackoffCap(t *testing.T) {
	t.Parallel()
	huge := Backoff{Base: 1 << 61, Max: 1<<63 - 1}
	for _, tc := range []struct {
		b       Backoff
		attempt int
		want    time.Duration
	}{
		{Backoff{Base: time.Second, Max: time.Minute}, 1, time.Second},
		{Backoff{Base: time.Second, Max: time.Minute}, 2, 2 * time.Second},
		{Backoff{Base: time.Second, Max: time.Minute}, 6, 32 * time.Second},
		{Backoff{Base: time.Second, Max: time.Minute}, 7, time.Minute},
		{Backoff{Base: time.Second, Max: time.Minute}, 1000, time.Minute},
		{huge, 2, 1 << 62},
		{huge, 3, 1<<63 - 1},
		{huge, 100, 1<<63 - 1},
	} {
		if got := tc.b.Cap(tc.attempt); got != tc.want {
			t.Errorf("%+v.Cap(%d) = %v, want %v", tc.b, tc.attempt, got, tc.want)
		}
	}
}

func TestRelayPermanent(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{answer: func(int, Message) (Outcome, error) {
			return OutcomePermanent, errors.New("provider answered 400: currency unsupported")
		}}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver})
		id := b.mustEnqueue(t, message("k"))
		runOnce(t, b, r, 1)
		if m := b.get(t, id); m.State != StateDead || m.LastError != "permanent: provider answered 400: currency unsupported" {
			t.Errorf("%+v, want dead with the error", m)
		}
	})
}

// TestRelayUnknown: an attempt whose outcome is unknown is sent again with
// the same key, never as a new operation.
func TestRelayUnknown(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{answer: func(n int, m Message) (Outcome, error) {
			if n == 0 {
				return OutcomeUnknown, context.DeadlineExceeded
			}
			return OutcomeDelivered, nil
		}}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver, Backoff: Backoff{Base: time.Second}})
		id := b.mustEnqueue(t, message("k-unknown"))
		runOnce(t, b, r, 1)
		m := b.get(t, id)
		if m.State != StatePending || m.LastError != "outcome unknown: context deadline exceeded" {
			t.Fatalf("after an unknown outcome: %+v", m)
		}
		b.clock.Set(m.AvailableAt)
		runOnce(t, b, r, 1)
		if m := b.get(t, id); m.State != StateDone || m.Attempts != 2 {
			t.Fatalf("after the resend: %+v", m)
		}
		if d.count() != 2 || d.call(0).IdempotencyKey != "k-unknown" || d.call(1).IdempotencyKey != "k-unknown" {
			t.Errorf("calls %+v, want two with the same key", d.calls)
		}
	})
}

func TestRelayOnUnknown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		settled   Outcome
		err       error
		wantState State
		wantError string
	}{
		{OutcomeDelivered, nil, StateDone, ""},
		{OutcomeRetry, nil, StatePending, "retry"},
		{OutcomePermanent, errors.New("refused"), StateDead, "permanent: refused"},
		{OutcomeUnknown, errors.New("provider unreachable"), StatePending,
			"outcome unknown: i/o timeout (reconciling: provider unreachable)"},
	} {
		t.Run(tc.settled.String(), func(t *testing.T) {
			t.Parallel()
			forEachStore(t, func(t *testing.T, b *bundle) {
				d := &recorder{answer: func(int, Message) (Outcome, error) {
					return OutcomeUnknown, errors.New("i/o timeout")
				}}
				var asked []string
				onUnknown := func(ctx context.Context, m Message) (Outcome, error) {
					if _, ok := ctx.Deadline(); !ok {
						t.Error("OnUnknown got a context without a deadline")
					}
					asked = append(asked, m.IdempotencyKey)
					return tc.settled, tc.err
				}
				r := newRelay(t, b, RelayConfig{Deliver: d.deliver, OnUnknown: onUnknown})
				id := b.mustEnqueue(t, message("k-reconcile"))
				runOnce(t, b, r, 1)
				m := b.get(t, id)
				if m.State != tc.wantState || m.LastError != tc.wantError {
					t.Errorf("%+v, want %s with error %q", m, tc.wantState, tc.wantError)
				}
				if d.count() != 1 || len(asked) != 1 || asked[0] != "k-reconcile" {
					t.Errorf("Deliver called %d times, OnUnknown asked %v", d.count(), asked)
				}
			})
		})
	}
}

// TestRelayOnUnknownAfterTimeout: a delivery that spends its whole budget
// leaves OnUnknown a budget of its own.
func TestRelayOnUnknownAfterTimeout(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	deliver := func(ctx context.Context, m Message) (Outcome, error) {
		<-ctx.Done()
		return OutcomeUnknown, ctx.Err()
	}
	onUnknown := func(ctx context.Context, m Message) (Outcome, error) {
		if err := ctx.Err(); err != nil {
			return OutcomeUnknown, err
		}
		return OutcomeDelivered, nil
	}
	r := newRelay(t, b, RelayConfig{Deliver: deliver, OnUnknown: onUnknown, DeliverTimeout: 20 * time.Millisecond})
	id := b.mustEnqueue(t, message("k"))
	runOnce(t, b, r, 1)
	if m := b.get(t, id); m.State != StateDone {
		t.Errorf("%+v, want done: OnUnknown had no time left", m)
	}
}

// TestRelayHookFailures: a panic or an invalid outcome may hide a sent
// message, so it counts as unknown and the message is retried with its key.
func TestRelayHookFailures(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{answer: func(n int, m Message) (Outcome, error) {
			switch n {
			case 0:
				panic("boom")
			case 1:
				return 0, nil
			}
			return OutcomeDelivered, nil
		}}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver, Backoff: Backoff{Base: time.Millisecond}})
		id := b.mustEnqueue(t, message("k"))
		runOnce(t, b, r, 1)
		m := b.get(t, id)
		if m.State != StatePending || m.LastError != "outcome unknown: deliver panicked: boom" {
			t.Fatalf("after a panic: %+v", m)
		}
		b.clock.Set(m.AvailableAt)
		runOnce(t, b, r, 1)
		m = b.get(t, id)
		if m.State != StatePending || m.LastError != "outcome unknown: deliver returned an invalid outcome 0" {
			t.Fatalf("after an invalid outcome: %+v", m)
		}
		b.clock.Set(m.AvailableAt)
		runOnce(t, b, r, 1)
		if m := b.get(t, id); m.State != StateDone || m.Attempts != 3 {
			t.Fatalf("after the third attempt: %+v", m)
		}
	})
}

// TestRelayExpiredClaim: a relay that dies holding a claim delays the
// message until the claim expires; another relay then sends it again (with
// the same key), unless that was the last allowed attempt.
func TestRelayExpiredClaim(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		d := &recorder{}
		r := newRelay(t, b, RelayConfig{Deliver: d.deliver, MaxAttempts: 2})
		id := b.mustEnqueue(t, message("k"))
		b.claim(t, 1) // a relay that dies
		runOnce(t, b, r, 0)
		b.clock.Advance(time.Minute)
		b.claim(t, 1) // another one, attempt 2 of 2, dies too
		b.clock.Advance(time.Minute)
		runOnce(t, b, r, 1)
		m := b.get(t, id)
		if m.State != StateDead || m.Attempts != 3 || !strings.Contains(m.LastError, "outcome unknown") {
			t.Errorf("%+v, want dead with an unknown outcome", m)
		}
		if d.count() != 0 {
			t.Errorf("Deliver called %d times past MaxAttempts", d.count())
		}
	})
}

// TestRelayLogs: logs use snake_case attributes and never the raw key.
func TestRelayLogs(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	var buf bytes.Buffer
	d := &recorder{answer: func(int, Message) (Outcome, error) { return OutcomeRetry, errors.New("503") }}
	r := newRelay(t, b, RelayConfig{Deliver: d.deliver, Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	b.mustEnqueue(t, message("secret-derived-key"))
	runOnce(t, b, r, 1)
	logs := buf.String()
	if strings.Contains(logs, "secret-derived-key") {
		t.Errorf("the key appears in the logs: %s", logs)
	}
	for _, attr := range []string{`"outbox_id":`, `"idempotency_key_hash":"9db6e29d8286710a"`, `"retry_in":`, `"attempt":1`} {
		if !strings.Contains(logs, attr) {
			t.Errorf("logs lack %s: %s", attr, logs)
		}
	}
}

func TestRelayStartStop(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	delivered := make(chan int64, 10)
	r := newRelay(t, b, RelayConfig{
		Deliver: func(ctx context.Context, m Message) (Outcome, error) {
			delivered <- m.ID
			return OutcomeDelivered, nil
		},
		PollInterval: time.Hour, // only Notify wakes it
	})
	r.Stop() // before Start: no-op, and then Start is refused
	if err := r.Start(b.ctx); !errors.Is(err, ErrStarted) {
		t.Fatalf("Start after Stop: %v, want ErrStarted", err)
	}

	r = newRelay(t, b, RelayConfig{
		Deliver: func(ctx context.Context, m Message) (Outcome, error) {
			delivered <- m.ID
			return OutcomeDelivered, nil
		},
		PollInterval: time.Hour,
	})
	if err := r.Start(b.ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Start(b.ctx); !errors.Is(err, ErrStarted) {
		t.Errorf("second Start: %v, want ErrStarted", err)
	}
	for i := range 3 {
		id := b.mustEnqueue(t, message(fmt.Sprint("k-", i)))
		r.Notify()
		select {
		case got := <-delivered:
			if got != id {
				t.Fatalf("delivered %d, want %d", got, id)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("message %d not delivered after Notify", id)
		}
	}
	r.Stop()
	r.Stop()
}

// TestRelayStopHandsBack: Stop lets the delivery in flight finish and be
// recorded, and hands the rest of the batch back unattempted.
func TestRelayStopHandsBack(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		inFlight, release := make(chan struct{}), make(chan struct{})
		var calls atomic.Int32
		r := newRelay(t, b, RelayConfig{Deliver: func(ctx context.Context, m Message) (Outcome, error) {
			if calls.Add(1) == 1 {
				close(inFlight)
				<-release
			}
			return OutcomeDelivered, nil
		}})
		ids := b.mustEnqueueAll(t, messages(4)...)
		if err := r.Start(b.ctx); err != nil {
			t.Fatal(err)
		}
		<-inFlight
		stopped := make(chan struct{})
		go func() { r.Stop(); close(stopped) }()
		deadline := time.Now().Add(10 * time.Second)
		for !closed(r.stopping) {
			if time.Now().After(deadline) {
				t.Fatal("Stop did not signal the relay")
			}
			runtime.Gosched()
		}
		close(release)
		<-stopped
		if got := b.get(t, ids[0]); got.State != StateDone {
			t.Errorf("the message in flight: %+v, want done", got)
		}
		for _, id := range ids[1:] {
			if got := b.get(t, id); got.State != StatePending || got.Attempts != 0 || !got.ClaimedUntil.IsZero() {
				t.Errorf("message %d: %+v, want handed back unattempted", id, got)
			}
		}
		if n := calls.Load(); n != 1 {
			t.Errorf("Deliver called %d times, want 1", n)
		}
	})
}

// TestRelayPassTimeout: a pass that runs out of time records the attempt in
// flight and hands the rest of its batch back.
func TestRelayPassTimeout(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	d := &recorder{answer: func(n int, m Message) (Outcome, error) {
		return OutcomeUnknown, errors.New("slow downstream")
	}}
	deliver := func(ctx context.Context, m Message) (Outcome, error) {
		<-ctx.Done() // spends the whole pass
		return d.deliver(ctx, m)
	}
	// Long enough for the claim to finish on a loaded machine, short enough
	// to spend in full.
	r := newRelay(t, b, RelayConfig{Deliver: deliver, PassTimeout: 500 * time.Millisecond})
	ids := b.mustEnqueueAll(t, messages(3)...)
	runOnce(t, b, r, 1)
	if m := b.get(t, ids[0]); m.State != StatePending || m.Attempts != 1 || !strings.HasPrefix(m.LastError, "outcome unknown") {
		t.Errorf("the attempt in flight: %+v", m)
	}
	for _, id := range ids[1:] {
		if m := b.get(t, id); m.Attempts != 0 || !m.ClaimedUntil.IsZero() {
			t.Errorf("message %d: %+v, want handed back", id, m)
		}
	}
}

// TestRelaysConcurrent runs several relays on one database: every message
// is delivered exactly once, and never by two relays at the same time.
func TestRelaysConcurrent(t *testing.T) {
	t.Parallel()
	forEachStore(t, func(t *testing.T, b *bundle) {
		const relays, rows = 4, 500
		b.mustEnqueueAll(t, messages(rows)...)
		var (
			mu        sync.Mutex
			inFlight  = make(map[int64]bool)
			delivered = make(map[int64]int)
			overlaps  atomic.Int32
			byRelay   [relays]atomic.Int32
			all       = make(chan struct{})
			started   []*Relay
		)
		for i := range relays {
			r := NewRelay(b.newStore(t), &RelayConfig{
				BatchSize:    10,
				PollInterval: 5 * time.Millisecond,
				Now:          b.clock.Now, // frozen: claims never expire
				Logger:       slog.New(slog.NewTextHandler(io.Discard, nil)),
				Deliver: func(ctx context.Context, m Message) (Outcome, error) {
					mu.Lock()
					if inFlight[m.ID] {
						overlaps.Add(1)
					}
					inFlight[m.ID] = true
					mu.Unlock()
					runtime.Gosched()
					mu.Lock()
					delete(inFlight, m.ID)
					delivered[m.ID]++
					if len(delivered) == rows && delivered[m.ID] == 1 {
						close(all)
					}
					mu.Unlock()
					byRelay[i].Add(1)
					return OutcomeDelivered, nil
				},
			})
			if err := r.Start(b.ctx); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(r.Stop)
			started = append(started, r)
		}
		select {
		case <-all:
		case <-time.After(60 * time.Second):
			mu.Lock()
			n := len(delivered)
			mu.Unlock()
			t.Fatalf("%d of %d messages delivered in time", n, rows)
		}
		for _, r := range started {
			r.Stop() // waits for the last outcomes to be recorded
		}
		mu.Lock()
		defer mu.Unlock()
		for id, n := range delivered {
			if n != 1 {
				t.Errorf("message %d delivered %d times", id, n)
			}
		}
		if n := overlaps.Load(); n != 0 {
			t.Errorf("%d deliveries overlapped another of the same message", n)
		}
		if c := counts(t, b); c[StateDone] != rows || c[StatePending] != 0 {
			t.Errorf("counts %v, want %d done", c, rows)
		}
		var share []int32
		for i := range byRelay {
			share = append(share, byRelay[i].Load())
		}
		t.Logf("deliveries per relay: %v", share)
	})
}

// TestRelayHandsBackWhatCannotGetItsBudget: a delivery is not started when
// the pass cannot give it its whole DeliverTimeout; it is handed back, not
// cut short into an unknown outcome.
func TestRelayHandsBackWhatCannotGetItsBudget(t *testing.T) {
	t.Parallel()
	b := setupSQLite(t)
	deliver := func(ctx context.Context, m Message) (Outcome, error) {
		select {
		case <-time.After(150 * time.Millisecond): // a slow but good delivery
			return OutcomeDelivered, nil
		case <-ctx.Done():
			return OutcomeUnknown, ctx.Err()
		}
	}
	r := newRelay(t, b, RelayConfig{Deliver: deliver, PassTimeout: 400 * time.Millisecond, DeliverTimeout: 300 * time.Millisecond})
	ids := b.mustEnqueueAll(t, messages(3)...)
	runOnce(t, b, r, 1)
	if m := b.get(t, ids[0]); m.State != StateDone {
		t.Errorf("the first delivery: %+v, want done", m)
	}
	for _, id := range ids[1:] {
		if m := b.get(t, id); m.State != StatePending || m.Attempts != 0 || !m.ClaimedUntil.IsZero() || m.LastError != "" {
			t.Errorf("message %d: %+v, want handed back untouched", id, m)
		}
	}
}
