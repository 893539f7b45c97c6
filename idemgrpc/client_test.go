package idemgrpc_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/dynamicpb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemclient"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
)

// fastRetries is a client config whose waits do not slow the tests.
func fastRetries() *idemgrpc.ClientConfig {
	return &idemgrpc.ClientConfig{RetryWaitMin: time.Millisecond, RetryWaitMax: 5 * time.Millisecond}
}

// failFirst makes the server answer the first n attempts with code, before
// the idem interceptor sees them.
func failFirst(b *bundle, n int, code codes.Code) {
	var mu sync.Mutex
	b.keys.outer = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		mu.Lock()
		fail := n > 0
		n--
		mu.Unlock()
		if fail {
			return nil, status.Error(code, "injected")
		}
		return handler(ctx, req)
	}
}

// TestClientKeepsKey: a covered call without a key gets a UUID v4 that
// every retry carries; the handler runs once.
func TestClientKeepsKey(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, fastRetries())
	failFirst(b, 3, codes.Unavailable)
	a := call(context.Background(), b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	if a.err != nil {
		t.Fatal(a.err)
	}
	keys := b.keys.list()
	if len(keys) != 4 {
		t.Fatalf("%d attempts, want 4", len(keys))
	}
	u, err := uuid.Parse(keys[0])
	if err != nil || u.Version() != 4 {
		t.Errorf("key %q is not a UUID v4 (%v)", keys[0], err)
	}
	for _, k := range keys {
		if k != keys[0] {
			t.Fatalf("keys differ across retries: %v", keys)
		}
	}
	if got := b.svc.runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
}

// TestClientKeySources: a key in the caller's metadata is kept as it is;
// with KeyField, the request's request_id is the key; NewKey makes the
// others (here UUID v7); a second logical call gets a new key.
func TestClientKeySources(t *testing.T) {
	t.Parallel()
	ccfg := fastRetries()
	ccfg.KeyField = "request_id"
	ccfg.NewKey = idemclient.NewKeyV7
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
	ctx := context.Background()
	call(ctx, b.conn, methodCreate, "caller-key", newRequest("acct-1", 500, "ignored-field"))
	call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, "field-key"))
	call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	keys := b.keys.list()
	if len(keys) != 4 || keys[0] != "caller-key" || keys[1] != "field-key" {
		t.Fatalf("keys %v", keys)
	}
	for _, k := range keys[2:] {
		if u, err := uuid.Parse(k); err != nil || u.Version() != 7 {
			t.Errorf("generated key %q is not a UUID v7 (%v)", k, err)
		}
	}
	if keys[2] == keys[3] {
		t.Errorf("two logical calls shared the key %q", keys[2])
	}
}

// TestClientEmptyNewKey: a NewKey that returns "" without an error fails
// the call with INTERNAL before anything is sent; it used to panic.
func TestClientEmptyNewKey(t *testing.T) {
	t.Parallel()
	ccfg := fastRetries()
	ccfg.NewKey = func() (string, error) { return "", nil }
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
	var a answer
	func() {
		defer func() {
			if p := recover(); p != nil {
				t.Fatalf("the call panicked: %v", p)
			}
		}()
		a = call(context.Background(), b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	}()
	if status.Code(a.err) != codes.Internal || !strings.Contains(status.Convert(a.err).Message(), "NewKey") {
		t.Fatalf("err = %v, want INTERNAL naming NewKey", a.err)
	}
	if keys := b.keys.list(); len(keys) != 0 {
		t.Fatalf("%d attempts reached the server, want none", len(keys))
	}
	// A key in the caller's metadata does not ask NewKey.
	if a := call(context.Background(), b.conn, methodCreate, "caller-key", newRequest("acct-1", 500, "")); a.err != nil {
		t.Fatal(a.err)
	}
}

// TestClientPolicy: which codes are retried, how often, and that calls
// that are not covered get neither a key nor a retry.
func TestClientPolicy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		code     codes.Code
		ccfg     func(*idemgrpc.ClientConfig)
		method   string
		attempts int
	}{
		{"unavailable", codes.Unavailable, nil, methodCreate, 4},
		{"aborted", codes.Aborted, nil, methodCreate, 4},
		{"internal", codes.Internal, nil, methodCreate, 4},
		{"deadline", codes.DeadlineExceeded, nil, methodCreate, 4},
		{"invalid argument is final", codes.InvalidArgument, nil, methodCreate, 1},
		{"not found is final", codes.NotFound, nil, methodCreate, 1},
		{"retry max", codes.Unavailable, func(c *idemgrpc.ClientConfig) { c.RetryMax = 2 }, methodCreate, 3},
		{"no retries", codes.Unavailable, func(c *idemgrpc.ClientConfig) { c.RetryMax = -1 }, methodCreate, 1},
		{"max elapsed", codes.Unavailable, func(c *idemgrpc.ClientConfig) {
			c.MaxElapsed = time.Second
			c.Backoff = func(time.Duration, time.Duration, int, error) time.Duration { return time.Hour }
		}, methodCreate, 1},
		{"not covered", codes.Unavailable, func(c *idemgrpc.ClientConfig) { c.Methods = []string{methodCreate} }, methodGet, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ccfg := fastRetries()
			if tt.ccfg != nil {
				tt.ccfg(ccfg)
			}
			b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
			failFirst(b, 3, tt.code)
			a := call(context.Background(), b.conn, tt.method, "", newRequest("acct-1", 500, ""))
			keys := b.keys.list()
			if len(keys) != tt.attempts {
				t.Errorf("%d attempts, want %d", len(keys), tt.attempts)
			}
			if wantErr := tt.attempts < 4; (a.err != nil) != wantErr || (wantErr && status.Code(a.err) != tt.code) {
				t.Errorf("error %v, want one with code %s: %v", a.err, tt.code, wantErr)
			}
			if tt.method == methodGet && keys[0] != "" {
				t.Errorf("an uncovered call got a key")
			}
		})
	}
}

// TestClientHonoursRetryInfo: a retry that finds the first call in flight
// gets ABORTED with a RetryInfo delay; the client waits that long, retries
// with the same key and gets the stored answer.
func TestClientHonoursRetryInfo(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var waits []time.Duration
	ccfg := fastRetries()
	ccfg.AttemptTimeout = 200 * time.Millisecond
	ccfg.Backoff = func(min, max time.Duration, attempt int, err error) time.Duration {
		d := idemgrpc.DefaultBackoff(min, max, attempt, err)
		mu.Lock()
		waits = append(waits, d)
		mu.Unlock()
		return d
	}
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
	aborted := make(chan struct{})
	var once sync.Once
	b.keys.outer = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		resp, err := handler(ctx, req)
		if status.Code(err) == codes.Aborted {
			once.Do(func() { close(aborted) })
		}
		return resp, err
	}
	b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
		<-aborted // ignores its context: runs on after the first attempt timed out
		return payment("pay_slow", 500, "acct-1"), nil
	}
	start := time.Now()
	a := call(context.Background(), b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	if a.err != nil || !a.replayed() || get(a.reply, "id").String() != "pay_slow" {
		t.Fatalf("call: %v, replayed %v", a.err, a.replayed())
	}
	if got := b.svc.runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}
	mu.Lock()
	defer mu.Unlock()
	// Attempt 1 timed out (DEADLINE_EXCEEDED, a short backoff); attempt 2
	// got ABORTED with RetryInfo (a wait of at least a second); attempt 3
	// got the replay.
	if len(waits) != 2 || waits[1] < time.Second {
		t.Fatalf("waits %v, want a short one then the RetryInfo delay (>= 1s)", waits)
	}
	if elapsed := time.Since(start); elapsed < waits[1] {
		t.Errorf("the call took %v, less than the RetryInfo delay %v", elapsed, waits[1])
	}
}

// TestClientOutcomeUnknown: OUTCOME_UNKNOWN is retried with the unknown
// outcome backoff, or returned at once with DisableUnknownOutcomeRetry.
func TestClientOutcomeUnknown(t *testing.T) {
	t.Parallel()
	for _, disable := range []bool{false, true} {
		ccfg := fastRetries()
		ccfg.RetryMax = 2
		ccfg.DisableUnknownOutcomeRetry = disable
		var unknownWaits int
		ccfg.UnknownOutcomeBackoff = func(min, max time.Duration, attempt int, err error) time.Duration {
			unknownWaits++
			return 0
		}
		b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
		b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
			idem.MarkUnknown(ctx)
			return nil, status.Error(codes.Unavailable, "the bank did not answer")
		}
		a := call(context.Background(), b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
		if idemgrpc.ErrorReason(a.err) != idemgrpc.ReasonOutcomeUnknown {
			t.Fatalf("disable=%v: %v, want OUTCOME_UNKNOWN", disable, a.err)
		}
		// Attempt 1 runs the handler (UNAVAILABLE, retried with the
		// ordinary backoff); attempts 2 and 3 find the record unknown, and
		// only the wait after attempt 2 is left before RetryMax.
		want := 1
		if disable {
			want = 0
		}
		if unknownWaits != want {
			t.Errorf("disable=%v: %d unknown-outcome waits, want %d", disable, unknownWaits, want)
		}
		if got := b.svc.runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	}
}

// TestClientContextEnds: a call whose context ends while it waits returns
// at once with the context's status.
func TestClientContextEnds(t *testing.T) {
	t.Parallel()
	ccfg := &idemgrpc.ClientConfig{RetryWaitMin: time.Hour, RetryWaitMax: time.Hour, MaxElapsed: -1}
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, ccfg)
	arrived := make(chan struct{})
	b.keys.outer = func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		close(arrived)
		return nil, status.Error(codes.Unavailable, "injected")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan answer)
	go func() { done <- call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, "")) }()
	<-arrived
	cancel()
	if a := <-done; status.Code(a.err) != codes.Canceled {
		t.Errorf("got %v, want CANCELLED", a.err)
	}
}

// TestDefaultRetryPolicy is the policy's table.
func TestDefaultRetryPolicy(t *testing.T) {
	t.Parallel()
	withReason := func(c codes.Code, reason string) error {
		st, _ := status.New(c, "x").WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: idemgrpc.ErrorDomain})
		return st.Err()
	}
	ctx := context.Background()
	for _, tt := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.Unavailable, ""), true},
		{status.Error(codes.DeadlineExceeded, ""), true},
		{status.Error(codes.Aborted, ""), true},
		{status.Error(codes.ResourceExhausted, ""), true},
		{status.Error(codes.Internal, ""), true},
		{status.Error(codes.Unknown, ""), true},
		{errors.New("plain"), true}, // UNKNOWN
		{withReason(codes.FailedPrecondition, idemgrpc.ReasonOutcomeUnknown), true},
		{withReason(codes.FailedPrecondition, idemgrpc.ReasonNotReplayable), false},
		{status.Error(codes.FailedPrecondition, ""), false},
		{withReason(codes.InvalidArgument, idemgrpc.ReasonKeyReused), false},
		{status.Error(codes.NotFound, ""), false},
		{status.Error(codes.Unimplemented, ""), false},
		{status.Error(codes.DataLoss, ""), false},
		{status.Error(codes.Canceled, ""), false},
	} {
		if got, err := idemgrpc.DefaultRetryPolicy(ctx, tt.err); got != tt.want || err != nil {
			t.Errorf("DefaultRetryPolicy(%v) = %v, %v; want %v", tt.err, got, err, tt.want)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if got, err := idemgrpc.DefaultRetryPolicy(cctx, status.Error(codes.Unavailable, "")); got || !errors.Is(err, context.Canceled) {
		t.Errorf("after the context ended: %v, %v", got, err)
	}
}

// TestDefaultBackoff: RetryInfo wins; otherwise full jitter under the
// exponential ceiling; the unknown-outcome backoff waits at least min.
func TestDefaultBackoff(t *testing.T) {
	t.Parallel()
	st, _ := status.New(codes.Aborted, "").WithDetails(&errdetails.RetryInfo{RetryDelay: durationpb.New(3 * time.Second)})
	if got := idemgrpc.DefaultBackoff(time.Millisecond, time.Second, 0, st.Err()); got != 3*time.Second {
		t.Errorf("with RetryInfo 3s: %v", got)
	}
	if got := idemgrpc.DefaultUnknownOutcomeBackoff(5*time.Second, time.Minute, 0, st.Err()); got != 5*time.Second {
		t.Errorf("unknown outcome with RetryInfo 3s and min 5s: %v", got)
	}
	plain := status.Error(codes.Unavailable, "")
	for attempt := range 10 {
		ceil := min(100*time.Millisecond<<attempt, 2*time.Second)
		for range 50 {
			if got := idemgrpc.DefaultBackoff(100*time.Millisecond, 2*time.Second, attempt, plain); got < 0 || got > ceil {
				t.Fatalf("attempt %d: %v outside [0, %v]", attempt, got, ceil)
			}
			u := idemgrpc.DefaultUnknownOutcomeBackoff(100*time.Millisecond, 2*time.Second, attempt, plain)
			if c := min(400*time.Millisecond<<attempt, 8*time.Second); u < c/2 || u > c {
				t.Fatalf("unknown outcome, attempt %d: %v outside [%v, %v]", attempt, u, c/2, c)
			}
		}
	}
}
