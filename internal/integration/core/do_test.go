package idem_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/integration/teststore"
	"github.com/idem-dev/idem/internal/testenv"
)

// TestDoRace: 200 goroutines call Do with one key at once; the function runs
// once. Without wait mode the others are told it is in progress (they all
// return while it still runs); once it is done all 200 replay its result;
// in wait mode all 200 get the result.
func TestDoRace(t *testing.T) {
	t.Parallel()
	const n = 200
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		store := teststore.Open(t, kind, clock.Now)
		ctx := context.Background()
		payload := charge{Account: "acct-1", Amount: 500}

		g := testGuard(store, clock, idem.GuardConfig{StoreTimeout: 30 * time.Second})
		var runs, refused atomic.Int64
		othersDone := make(chan struct{})
		fn := func(ctx context.Context) (receipt, error) {
			runs.Add(1)
			select { // hold the lease until every other caller was refused
			case <-othersDone:
			case <-time.After(60 * time.Second):
				t.Error("the other callers did not all return while the function ran")
			}
			return receipt{ID: "ch_1", Amount: 500}, nil
		}
		results := make([]error, n)
		testenv.Race(n, func(i int) {
			r, err := idem.Do(ctx, g, "race-key", "charge", payload, fn)
			results[i] = err
			if err == nil && r != (receipt{ID: "ch_1", Amount: 500}) {
				t.Errorf("caller %d got %+v", i, r)
			}
			if err != nil && refused.Add(1) == n-1 {
				close(othersDone)
			}
		})
		if got := runs.Load(); got != 1 {
			t.Fatalf("the function ran %d times, want 1", got)
		}
		for i, err := range results {
			var ie *idem.Error
			if err != nil && (!errors.Is(err, idem.ErrInProgress) || !errors.As(err, &ie) || ie.RetryAfter < time.Second) {
				t.Errorf("caller %d: %v, want nil or ErrInProgress with a Retry-After", i, err)
			}
		}
		if refused.Load() != n-1 {
			t.Errorf("%d callers were refused, want %d", refused.Load(), n-1)
		}

		testenv.Race(n, func(i int) {
			r, err := idem.Do(ctx, g, "race-key", "charge", payload, fn)
			if err != nil || r.ID != "ch_1" {
				t.Errorf("replay %d: %+v, %v", i, r, err)
			}
		})
		if got := runs.Load(); got != 1 {
			t.Fatalf("after the replays the function ran %d times, want 1", got)
		}

		waiting := testGuard(store, clock, idem.GuardConfig{Wait: time.Minute, StoreTimeout: 30 * time.Second})
		var waitRuns atomic.Int64
		testenv.Race(n, func(i int) {
			r, err := idem.Do(ctx, waiting, "wait-key", "charge", payload, func(context.Context) (receipt, error) {
				return receipt{ID: fmt.Sprint("ch_", waitRuns.Add(1)), Amount: 500}, nil
			})
			if err != nil || r.ID != "ch_1" {
				t.Errorf("waiting caller %d: %+v, %v", i, r, err)
			}
		})
		if got := waitRuns.Load(); got != 1 {
			t.Fatalf("in wait mode the function ran %d times, want 1", got)
		}
	})
}

// TestDoLeaseExpiry: a function whose lease expires while it runs (its
// heartbeat cannot reach the store, and the clock moves past the lease)
// leaves the key unknown: a retry is refused with ErrOutcomeUnknown and the
// function never runs twice. Its late, true outcome still settles the
// record, and retries then replay it.
func TestDoLeaseExpiry(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		store := teststore.Open(t, kind, clock.Now)
		g := testGuard(heartbeatDown{store}, clock, idem.GuardConfig{Lease: 30 * time.Second})
		ctx := context.Background()
		payload := charge{Account: "acct-1", Amount: 700}
		var runs atomic.Int64
		started, finish := make(chan struct{}), make(chan struct{})
		type outcome struct {
			r   receipt
			err error
		}
		first := make(chan outcome, 1)
		go func() {
			r, err := idem.Do(ctx, g, "slow-key", "charge", payload, func(context.Context) (receipt, error) {
				runs.Add(1)
				close(started)
				<-finish
				return receipt{ID: "ch_slow", Amount: 700}, nil
			})
			first <- outcome{r, err}
		}()
		<-started
		again := func(context.Context) (receipt, error) {
			runs.Add(1)
			return receipt{ID: "ch_again"}, nil
		}
		if _, err := idem.Do(ctx, g, "slow-key", "charge", payload, again); !errors.Is(err, idem.ErrInProgress) {
			t.Fatalf("retry under a live lease: %v, want ErrInProgress", err)
		}
		clock.Advance(31 * time.Second)
		_, err := idem.Do(ctx, g, "slow-key", "charge", payload, again)
		var ie *idem.Error
		if !errors.Is(err, idem.ErrOutcomeUnknown) || !errors.As(err, &ie) || ie.RetryAfter <= 0 {
			t.Fatalf("retry after the lease expired: %v, want ErrOutcomeUnknown with a Retry-After", err)
		}
		rec, err := store.KeyGet(ctx, idemstore.Identity{Endpoint: "charge", Key: "slow-key"})
		if err != nil || rec.State != idemstore.StateUnknown {
			t.Fatalf("record after the expiry: %+v, %v; want unknown", rec, err)
		}
		clock.Advance(time.Hour) // still unknown: nothing re-runs it
		if _, err := idem.Do(ctx, g, "slow-key", "charge", payload, again); !errors.Is(err, idem.ErrOutcomeUnknown) {
			t.Fatalf("retry an hour later: %v, want ErrOutcomeUnknown", err)
		}

		close(finish)
		o := <-first
		if o.err != nil || o.r.ID != "ch_slow" {
			t.Fatalf("the slow call returned %+v, %v", o.r, o.err)
		}
		r, err := idem.Do(ctx, g, "slow-key", "charge", payload, again)
		if err != nil || r.ID != "ch_slow" {
			t.Fatalf("retry after the late outcome: %+v, %v; want the replayed ch_slow", r, err)
		}
		if got := runs.Load(); got != 1 {
			t.Fatalf("the function ran %d times, want 1", got)
		}
	})
}

// heartbeatDown is a store whose lease renewals fail, as when the process
// running the function is cut off from the store: moving the test clock
// past the lease lets it lapse instead of renewing it.
type heartbeatDown struct{ idemstore.Store }

func (heartbeatDown) KeyRenew(context.Context, *idemstore.RenewParams) error { return errOutage }

// TestDoKeyReused: the same key with another payload is refused, on every
// store, and runs nothing; a member left out of the fingerprint may differ.
func TestDoKeyReused(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		store := teststore.Open(t, kind, clock.Now)
		g := testGuard(store, clock, idem.GuardConfig{})
		ctx := context.Background()
		var runs atomic.Int64
		fn := func(context.Context) (receipt, error) {
			return receipt{ID: fmt.Sprint("ch_", runs.Add(1))}, nil
		}
		opt := idem.WithFingerprint(idem.FingerprintConfig{Exclude: []string{"sent_at"}})
		if _, err := idem.Do(ctx, g, "k", "charge", charge{Account: "a", Amount: 1, SentAt: "10:00"}, fn, opt); err != nil {
			t.Fatal(err)
		}
		r, err := idem.Do(ctx, g, "k", "charge", charge{Account: "a", Amount: 1, SentAt: "10:05"}, fn, opt)
		if err != nil || r.ID != "ch_1" {
			t.Fatalf("retry with another sent_at: %+v, %v; want the replay", r, err)
		}
		_, err = idem.Do(ctx, g, "k", "charge", charge{Account: "a", Amount: 2}, fn, opt)
		if !errors.Is(err, idem.ErrKeyReused) {
			t.Fatalf("another amount: %v, want ErrKeyReused", err)
		}
		var ie *idem.Error
		if !errors.As(err, &ie) || ie.Code() != idem.CodeKeyReused {
			t.Fatalf("another amount: %#v, want an *idem.Error with code %s", err, idem.CodeKeyReused)
		}
		// The same key in another scope or operation is another record.
		if r, err := idem.Do(ctx, g, "k", "charge", charge{Account: "a", Amount: 2}, fn, idem.WithScope("tenant-b")); err != nil || r.ID != "ch_2" {
			t.Fatalf("another scope: %+v, %v", r, err)
		}
		if r, err := idem.Do(ctx, g, "k", "refund", charge{Account: "a", Amount: 2}, fn); err != nil || r.ID != "ch_3" {
			t.Fatalf("another operation: %+v, %v", r, err)
		}
		if got := runs.Load(); got != 3 {
			t.Fatalf("the function ran %d times, want 3", got)
		}
	})
}

// crashChildEnv tells a re-executed test binary to be TestDoCrashChild: the
// store to open ("sqlite:PATH" or "postgres:SCHEMA") and the file its
// function appends its effect to.
const (
	crashChildEnv   = "IDEM_TEST_DO_CRASH_STORE"
	crashEffectsEnv = "IDEM_TEST_DO_CRASH_EFFECTS"
	crashRunning    = "idem-crash-child: running"
)

// TestDoCrash: a process is SIGKILLed while its function runs (after the
// function's effect). The key stays in progress while the dead attempt's
// lease lasts, then turns unknown; no retry ever runs the function again.
func TestDoCrash(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock()
			store, spec := teststore.OpenDurable(t, kind, clock.Now)
			effects := filepath.Join(t.TempDir(), "effects")
			env := []string{crashChildEnv + "=" + spec, crashEffectsEnv + "=" + effects}
			testenv.KillChild(t, "TestDoCrashChild", env, crashRunning)
			// The child leased on the wall clock, after this clock started:
			// bring it to the wall clock's now, so that 31 s on it are past
			// the lease however long the child took to start.
			clock.Set(time.Now().Truncate(time.Millisecond))

			g := testGuard(store, clock, idem.GuardConfig{Lease: 30 * time.Second})
			ctx := context.Background()
			never := func(context.Context) (receipt, error) {
				t.Error("a retry ran the function of the killed attempt again")
				return receipt{}, nil
			}
			payload := charge{Account: "acct-9", Amount: 900}
			if _, err := idem.Do(ctx, g, "crash-key", "charge", payload, never); !errors.Is(err, idem.ErrInProgress) {
				t.Fatalf("retry while the dead attempt's lease lasts: %v, want ErrInProgress", err)
			}
			clock.Advance(31 * time.Second)
			for range 3 {
				if _, err := idem.Do(ctx, g, "crash-key", "charge", payload, never); !errors.Is(err, idem.ErrOutcomeUnknown) {
					t.Fatalf("retry after the lease: %v, want ErrOutcomeUnknown", err)
				}
				clock.Advance(24 * time.Hour) // retention does not end an unknown outcome
			}
			rec, err := store.KeyGet(ctx, idemstore.Identity{Endpoint: "charge", Key: "crash-key"})
			if err != nil || rec.State != idemstore.StateUnknown || rec.Attempts != 1 {
				t.Fatalf("record: %+v, %v; want unknown after one attempt", rec, err)
			}
			b, err := os.ReadFile(effects)
			if err != nil || strings.Count(string(b), "charged\n") != 1 {
				t.Fatalf("effects %q, %v; want one charge", b, err)
			}
		})
	}
}

// TestDoCrashChild is the process TestDoCrash kills: it runs a function
// that does its effect, says so and then hangs.
func TestDoCrashChild(t *testing.T) {
	spec := os.Getenv(crashChildEnv)
	if spec == "" {
		t.Skip("run by TestDoCrash in a child process")
	}
	store := teststore.Reopen(t, spec, time.Now)
	g := idem.NewGuard(store, &idem.GuardConfig{Lease: 30 * time.Second, Logger: quietLogger()})
	idem.Do(context.Background(), g, "crash-key", "charge", charge{Account: "acct-9", Amount: 900}, func(context.Context) (receipt, error) {
		f, err := os.OpenFile(os.Getenv(crashEffectsEnv), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintln(f, "charged")
		f.Close()
		fmt.Println(crashRunning)
		time.Sleep(2 * time.Minute) // until killed
		return receipt{}, nil
	})
	t.Fatal("the child was not killed")
}
