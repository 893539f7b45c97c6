package idem_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// guardBundle is what setupGuard returns: a Guard on a memory store that can
// fail, with a test clock, counted runs and the captured log.
type guardBundle struct {
	clock *idemtest.Clock
	store *faultStore
	guard *idem.Guard
	runs  atomic.Int64
	logs  *syncBuffer
}

func setupGuard(t *testing.T, cfg idem.GuardConfig) *guardBundle {
	t.Helper()
	b := &guardBundle{clock: newTestClock(), logs: &syncBuffer{}}
	b.store = newFaultStore(idemmem.New(&idemmem.Config{Now: b.clock.Now}))
	cfg.Logger = slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	b.guard = testGuard(b.store, b.clock, cfg)
	t.Cleanup(func() {
		if strings.Contains(b.logs.String(), "key-one") {
			t.Errorf("a raw key appeared in the log:\n%s", b.logs.String())
		}
	})
	return b
}

var callOne = idem.Call{Identity: idemstore.Identity{Scope: "t1", Endpoint: "/pkg.Svc/Charge", Key: "key-one"}, Fingerprint: "fp-1"}

// run calls Run with a function that counts its runs and does what f says.
func (b *guardBundle) run(call idem.Call, f func(ctx context.Context) (idem.Result, error)) (idem.Result, bool, error) {
	return b.guard.Run(context.Background(), call, func(ctx context.Context) (idem.Result, error) {
		b.runs.Add(1)
		return f(ctx)
	})
}

// hold starts call in the background with a function that runs until
// release is called, and returns once the function runs; release lets it
// finish and waits for the call to return.
func (b *guardBundle) hold(call idem.Call) (release func()) {
	started, finish, done := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		b.run(call, func(ctx context.Context) (idem.Result, error) {
			close(started)
			<-finish
			return okResult(ctx)
		})
	}()
	<-started
	return func() {
		close(finish)
		<-done
	}
}

func okResult(context.Context) (idem.Result, error) {
	return idem.Result{Status: 201, Meta: map[string][]string{"grpc-status": {"0"}, "x-id": {"a", "b"}}, Body: []byte("\x0a\x03abc")}, nil
}

func (b *guardBundle) state(t *testing.T, call idem.Call) idemstore.State {
	t.Helper()
	rec, err := b.store.KeyGet(context.Background(), call.Identity)
	if errors.Is(err, idemstore.ErrNotFound) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	return rec.State
}

// TestGuardHeartbeat: Call.Heartbeat is called after each renewal of the
// lease while the function runs, and not once the lease is lost.
func TestGuardHeartbeat(t *testing.T) {
	t.Parallel()
	const lease = 30 * time.Second
	b := setupGuard(t, idem.GuardConfig{Lease: lease})
	var beats atomic.Int64
	beat := make(chan struct{}, 16)
	call := callOne
	call.Heartbeat = func() {
		beats.Add(1)
		beat <- struct{}{}
	}
	release := b.hold(call)
	for i := range 3 {
		b.clock.Advance(lease / 3)
		select {
		case <-beat:
		case <-time.After(10 * time.Second):
			t.Fatalf("no heartbeat after renewal %d", i+1)
		}
	}
	for len(b.store.renewed) > 0 {
		<-b.store.renewed
	}
	b.store.loseRenew.Store(true)
	b.clock.Advance(lease / 3)
	<-b.store.renewed
	// The heartbeat would follow the renewal at once: give it the time to.
	select {
	case <-beat:
		t.Fatal("a heartbeat after the lease was lost")
	case <-time.After(100 * time.Millisecond):
	}
	release()
	if n := beats.Load(); n != 3 {
		t.Fatalf("%d heartbeats, want 3", n)
	}
}

func TestGuardCompletesAndReplays(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	first, replayed, err := b.run(callOne, okResult)
	if err != nil || replayed {
		t.Fatalf("first run: replayed %v, %v", replayed, err)
	}
	second, replayed, err := b.run(callOne, okResult)
	if err != nil || !replayed {
		t.Fatalf("retry: replayed %v, %v", replayed, err)
	}
	if fmt.Sprint(second) != fmt.Sprint(first) {
		t.Fatalf("replay %+v, want %+v", second, first)
	}
	second.Meta["x-id"][0] = "changed" // the caller's copy
	second.Body[0] = 'X'
	third, _, _ := b.run(callOne, okResult)
	if fmt.Sprint(third) != fmt.Sprint(first) {
		t.Fatalf("a caller's change to a replay reached the store: %+v", third)
	}
	if b.runs.Load() != 1 {
		t.Fatalf("ran %d times, want 1", b.runs.Load())
	}
	if s := b.state(t, callOne); s != idemstore.StateCompleted {
		t.Fatalf("state %q", s)
	}
}

func TestGuardZeroStatusIs200(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	b.run(callOne, func(context.Context) (idem.Result, error) { return idem.Result{Body: []byte("x")}, nil })
	res, replayed, err := b.run(callOne, okResult)
	if err != nil || !replayed || res.Status != 200 || string(res.Body) != "x" {
		t.Fatalf("replay %+v, %v, %v", res, replayed, err)
	}
}

// TestGuardAfterFunction pins the after-the-function policy: an error
// releases, MarkUnknown marks unknown, Reject drops, a panic marks unknown.
func TestGuardAfterFunction(t *testing.T) {
	t.Parallel()
	errBoom := errors.New("downstream said no")
	for _, tc := range []struct {
		name      string
		fn        func(ctx context.Context) (idem.Result, error)
		wantErr   error
		wantState idemstore.State
		retryErr  error // what a retry with the same fingerprint gets; nil: runs again
		retryRuns bool
	}{
		{"error releases", func(context.Context) (idem.Result, error) { return idem.Result{}, errBoom },
			errBoom, idemstore.StateReleased, nil, true},
		{"MarkUnknown and error", func(ctx context.Context) (idem.Result, error) {
			idem.MarkUnknown(ctx)
			return idem.Result{}, errBoom
		}, errBoom, idemstore.StateUnknown, idem.ErrOutcomeUnknown, false},
		{"MarkUnknown and success", func(ctx context.Context) (idem.Result, error) {
			idem.MarkUnknown(ctx)
			return okResult(ctx)
		}, nil, idemstore.StateUnknown, idem.ErrOutcomeUnknown, false},
		{"Reject drops", func(ctx context.Context) (idem.Result, error) {
			idem.Reject(ctx)
			return idem.Result{Status: 400}, errBoom
		}, errBoom, "", nil, true},
		{"too large is not replayable", func(context.Context) (idem.Result, error) {
			return idem.Result{Body: bytes.Repeat([]byte("x"), 11)}, nil
		}, nil, idemstore.StateCompleted, idem.ErrNotReplayable, false},
		{"NotReplayable", func(context.Context) (idem.Result, error) {
			return idem.Result{Body: []byte("x"), NotReplayable: true}, nil
		}, nil, idemstore.StateCompleted, idem.ErrNotReplayable, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setupGuard(t, idem.GuardConfig{MaxResponse: 10})
			if _, _, err := b.run(callOne, tc.fn); !errors.Is(err, tc.wantErr) || (tc.wantErr == nil) != (err == nil) {
				t.Fatalf("Run: %v, want %v", err, tc.wantErr)
			}
			if s := b.state(t, callOne); s != tc.wantState {
				t.Fatalf("state %q, want %q", s, tc.wantState)
			}
			_, _, err := b.run(callOne, okResult)
			if tc.retryErr != nil && !errors.Is(err, tc.retryErr) || tc.retryErr == nil && err != nil {
				t.Fatalf("retry: %v, want %v", err, tc.retryErr)
			}
			if want := map[bool]int64{true: 2, false: 1}[tc.retryRuns]; b.runs.Load() != want {
				t.Fatalf("ran %d times, want %d", b.runs.Load(), want)
			}
		})
	}
}

func TestGuardPanicMarksUnknown(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	func() {
		defer func() {
			if v := recover(); v != "boom" {
				t.Fatalf("recovered %v, want the function's panic", v)
			}
		}()
		b.run(callOne, func(context.Context) (idem.Result, error) { panic("boom") })
	}()
	if s := b.state(t, callOne); s != idemstore.StateUnknown {
		t.Fatalf("state %q, want unknown", s)
	}
	if _, _, err := b.run(callOne, okResult); !errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("retry: %v", err)
	}
}

func TestGuardRefusals(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	b.run(callOne, okResult)
	other := callOne
	other.Fingerprint = "fp-2"
	_, _, err := b.run(other, okResult)
	var ie *idem.Error
	if !errors.Is(err, idem.ErrKeyReused) || !errors.As(err, &ie) || ie.Code() != idem.CodeKeyReused {
		t.Fatalf("another fingerprint: %v", err)
	}
	if strings.Contains(err.Error(), "key-one") {
		t.Fatalf("the error names the key: %v", err)
	}

	for _, key := range []string{"", strings.Repeat("k", idem.MaxKeyLength+1), "tab\there", "caf\xc3\xa9"} {
		c := callOne
		c.Key = key
		if _, _, err := b.run(c, okResult); !errors.Is(err, idem.ErrKeyInvalid) {
			t.Errorf("key %q: %v, want ErrKeyInvalid", key, err)
		}
	}
	short := setupGuard(t, idem.GuardConfig{MinKeyLength: 16})
	if _, _, err := short.run(callOne, okResult); !errors.Is(err, idem.ErrKeyInvalid) {
		t.Errorf("short key: %v, want ErrKeyInvalid", err)
	}
	if b.runs.Load() != 1 || short.runs.Load() != 0 {
		t.Fatalf("ran %d and %d times, want 1 and 0", b.runs.Load(), short.runs.Load())
	}
	if b.store.reserves.Load() != 2 {
		t.Fatalf("%d reservations: invalid keys reached the store", b.store.reserves.Load())
	}
}

func TestGuardStoreUnavailable(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	b.store.failReserve.Store(true)
	_, _, err := b.run(callOne, okResult)
	var ie *idem.Error
	if !errors.Is(err, idem.ErrStoreUnavailable) || !errors.Is(err, errOutage) || !errors.As(err, &ie) || ie.RetryAfter <= 0 {
		t.Fatalf("Run: %v, want ErrStoreUnavailable caused by the outage, with a Retry-After", err)
	}
	if b.runs.Load() != 0 {
		t.Fatal("the function ran unprotected")
	}

	open := setupGuard(t, idem.GuardConfig{FailOpen: true})
	open.store.failReserve.Store(true)
	if _, _, err := open.run(callOne, okResult); err != nil || open.runs.Load() != 1 {
		t.Fatalf("fail-open: %v, %d runs", err, open.runs.Load())
	}
	if !strings.Contains(open.logs.String(), "UNPROTECTED") {
		t.Fatal("fail-open ran the function without a loud log line")
	}
}

// TestGuardNotRecorded: the function ran but its completion could not be
// written: the caller gets the result and ErrNotRecorded (a consumer must
// not acknowledge), and the record turns unknown, never re-run.
func TestGuardNotRecorded(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{Lease: 30 * time.Second})
	b.store.failComplete.Store(true)
	res, _, err := b.run(callOne, okResult)
	if !errors.Is(err, idem.ErrNotRecorded) || res.Status != 201 {
		t.Fatalf("Run: %+v, %v; want the result and ErrNotRecorded", res, err)
	}
	b.store.failComplete.Store(false)
	b.clock.Advance(31 * time.Second)
	if _, _, err := b.run(callOne, okResult); !errors.Is(err, idem.ErrOutcomeUnknown) {
		t.Fatalf("retry: %v, want ErrOutcomeUnknown", err)
	}
	if b.runs.Load() != 1 {
		t.Fatalf("ran %d times", b.runs.Load())
	}
}

func TestGuardContext(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{})
	b.run(callOne, func(ctx context.Context) (idem.Result, error) {
		if k, ok := idem.KeyFromContext(ctx); !ok || k != "key-one" {
			t.Errorf("KeyFromContext: %q, %v", k, ok)
		}
		if d := idem.DerivedKeyFromContext(ctx, "bank"); d != idem.DeriveKey(callOne.Identity, "bank") || d == "" {
			t.Errorf("DerivedKeyFromContext: %q", d)
		}
		if _, err := idemstore.TxFromContext(ctx); !errors.Is(err, idemstore.ErrNoTx) {
			t.Errorf("TxFromContext outside transactional mode: %v", err)
		}
		return okResult(ctx)
	})
	if b.runs.Load() != 1 {
		t.Fatal("did not run")
	}
}

// TestGuardWaitGivesUp: a caller waiting on an in-progress key whose context
// ends gets ErrInProgress with the context's error.
func TestGuardWaitGivesUp(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{Wait: time.Minute})
	release := b.hold(callOne)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, _, err := b.guard.Run(ctx, callOne, okResult)
	if !errors.Is(err, idem.ErrInProgress) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want ErrInProgress caused by context.Canceled", err)
	}
	release()
}

func TestGuardTooManyKeys(t *testing.T) {
	t.Parallel()
	b := setupGuard(t, idem.GuardConfig{MaxInProgressPerScope: 1})
	release := b.hold(callOne)
	other := callOne
	other.Key = "key-two"
	if _, _, err := b.run(other, okResult); !errors.Is(err, idem.ErrTooManyKeys) {
		t.Fatalf("second key in the scope: %v, want ErrTooManyKeys", err)
	}
	release()
	if _, _, err := b.run(other, okResult); err != nil {
		t.Fatalf("after the first finished: %v", err)
	}
}

// TestGuardMetricsAndTracing: a Guard reports the middleware's decisions,
// store calls and spans.
func TestGuardMetricsAndTracing(t *testing.T) {
	t.Parallel()
	m := &countingMetrics{decisions: map[idem.Decision]int{}, ops: map[string]int{}}
	tr := &recordingTracer{attrs: map[string]string{}}
	b := setupGuard(t, idem.GuardConfig{Metrics: m, Tracer: tr})
	b.run(callOne, func(context.Context) (idem.Result, error) { return idem.Result{}, errors.New("no") }) // created, released
	b.run(callOne, okResult)                                                                              // released_retried, completed
	b.run(callOne, okResult)                                                                              // replayed
	other := callOne
	other.Fingerprint = "fp-2"
	b.run(other, okResult) // key_reused
	b.store.failReserve.Store(true)
	b.run(callOne, okResult) // store_error
	want := map[idem.Decision]int{
		idem.DecisionCreated: 1, idem.DecisionReleasedRetried: 1, idem.DecisionReplayed: 1,
		idem.DecisionKeyReused: 1, idem.DecisionStoreError: 1,
	}
	for d, n := range want {
		if m.decisions[d] != n {
			t.Errorf("%s = %d, want %d (all: %v)", d, m.decisions[d], n, m.decisions)
		}
	}
	if m.ops["reserve"] != 5 || m.ops["release"] != 1 || m.ops["complete"] != 1 {
		t.Errorf("store calls %v", m.ops)
	}
	wantSpans := "[idem.reserve idem.handler idem.complete idem.request]"
	if got := fmt.Sprint(tr.spans[:4]); got != wantSpans {
		t.Errorf("spans of the first call %s, want %s", got, wantSpans)
	}
	if tr.attrs["idem.endpoint"] != "/pkg.Svc/Charge" || len(tr.attrs["idem.key_hash"]) != 16 {
		t.Errorf("attributes %v", tr.attrs)
	}
	for _, v := range tr.attrs {
		if strings.Contains(v, "key-one") {
			t.Fatal("a span attribute carries the raw key")
		}
	}
}
