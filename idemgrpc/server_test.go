package idemgrpc_test

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/uuid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/types/dynamicpb"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemgrpc"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/integration/teststore"
)

// TestLostResponses is issue 17's "done when" for gRPC: a client whose
// first two answers are lost (a TCP relay drops them and closes the
// connection after the call went through) retries through
// UnaryClientInterceptor with one key, the handler runs once, and the
// client gets the stored response, marked replayed.
func TestLostResponses(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		b := setup(t, teststore.Open(t, kind, clock.Now), clock, idemgrpc.Config{}, nil)
		relay := newLossyRelay(t, b.addr, 2)
		conn := dial(t, relay.addr(), &idemgrpc.ClientConfig{RetryWaitMin: time.Millisecond, RetryWaitMax: 20 * time.Millisecond})

		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		a := call(ctx, conn, methodCreate, "", newRequest("acct-1", 500, ""))
		if a.err != nil {
			t.Fatalf("call: %v", a.err)
		}
		if got := b.svc.runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		if got := relay.lost.Load(); got != 2 {
			t.Errorf("the relay lost %d answers, want 2", got)
		}
		keys := b.keys.list()
		if len(keys) != 3 {
			t.Fatalf("the server saw %d attempts, want 3 (two lost answers, one delivered)", len(keys))
		}
		if _, err := uuid.Parse(keys[0]); err != nil {
			t.Errorf("the client's key %q is not a UUID: %v", keys[0], err)
		}
		for i, k := range keys {
			if k != keys[0] {
				t.Errorf("attempt %d carried another key than the first", i+1)
			}
		}
		if !a.replayed() {
			t.Errorf("the delivered answer is not marked replayed: header %v trailer %v", a.header, a.trailer)
		}
		if id := get(a.reply, "id").String(); id != "pay_1" {
			t.Errorf("reply id %q, want pay_1 (the first execution's)", id)
		}
		rec, err := b.store.KeyGet(ctx, idemstore.Identity{Endpoint: methodCreate, Key: keys[0]})
		if err != nil {
			t.Fatalf("KeyGet: %v", err)
		}
		if rec.State != idemstore.StateCompleted || rec.Response == nil {
			t.Fatalf("record state %s, response %v; want completed with a response", rec.State, rec.Response)
		}
		want, _ := proto.Marshal(a.reply)
		if !proto.Equal(a.reply, unmarshalPayment(t, rec.Response.Body)) || len(want) == 0 {
			t.Errorf("the reply differs from the stored response")
		}
		if got := rec.Response.Header["Grpc-Message-Type"]; len(got) != 1 || got[0] != "idem.test.v1.Payment" {
			t.Errorf("stored message type %v", got)
		}
	})
}

func unmarshalPayment(t *testing.T, b []byte) *dynamicpb.Message {
	t.Helper()
	m := dynamicpb.NewMessage(paymentDesc)
	if err := proto.Unmarshal(b, m); err != nil {
		t.Fatalf("stored body: %v", err)
	}
	return m
}

// TestRace: 200 concurrent calls with one key run the handler once; the
// others, answered while it runs, get ABORTED with KEY_IN_USE and a
// RetryInfo; afterwards every call replays its answer.
func TestRace(t *testing.T) {
	t.Parallel()
	const n = 200
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		b := setup(t, teststore.Open(t, kind, clock.Now), clock, idemgrpc.Config{Guard: idem.GuardConfig{StoreTimeout: 30 * time.Second}}, nil)
		othersDone := make(chan struct{})
		b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
			select { // hold the lease until every other call was answered
			case <-othersDone:
			case <-time.After(60 * time.Second):
				t.Error("the other calls were not all answered while the handler ran")
			}
			return payment("pay_race", 500, "acct-1"), nil
		}
		ctx := context.Background()
		answers := make([]answer, n)
		var wg sync.WaitGroup
		var refused atomic.Int64
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				answers[i] = call(ctx, b.conn, methodCreate, "race-key", newRequest("acct-1", 500, ""))
				if answers[i].err != nil && refused.Add(1) == n-1 {
					close(othersDone)
				}
			}()
		}
		wg.Wait()
		if got := b.svc.runs.Load(); got != 1 {
			t.Fatalf("handler ran %d times, want 1", got)
		}
		ok := 0
		for _, a := range answers {
			if a.err == nil {
				ok++
				continue
			}
			checkRefusal(t, a.err, codes.Aborted, idemgrpc.ReasonKeyInUse, true)
		}
		if ok != 1 {
			t.Errorf("%d calls got the answer, want 1", ok)
		}
		var again [n]answer
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				again[i] = call(ctx, b.conn, methodCreate, "race-key", newRequest("acct-1", 500, ""))
			}()
		}
		wg.Wait()
		for _, a := range again {
			if a.err != nil || !a.replayed() || get(a.reply, "id").String() != "pay_race" {
				t.Fatalf("retry after completion: err %v, replayed %v", a.err, a.replayed())
			}
		}
		if got := b.svc.runs.Load(); got != 1 {
			t.Errorf("handler ran %d times after the retries, want 1", got)
		}
	})
}

// checkRefusal fails unless err is a status with code and an ErrorInfo of
// reason in idem's domain, and a positive RetryInfo exactly when retry.
func checkRefusal(t *testing.T, err error, code codes.Code, reason string, retry bool) {
	t.Helper()
	st, ok := status.FromError(err)
	if !ok || st.Code() != code {
		t.Fatalf("got %v, want code %s", err, code)
	}
	var info *errdetails.ErrorInfo
	var ri *errdetails.RetryInfo
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			info = d
		case *errdetails.RetryInfo:
			ri = d
		}
	}
	if info == nil || info.Domain != idemgrpc.ErrorDomain || info.Reason != reason {
		t.Errorf("ErrorInfo %v, want reason %s in domain %s", info, reason, idemgrpc.ErrorDomain)
	}
	if retry != (ri != nil && ri.RetryDelay.AsDuration() > 0) {
		t.Errorf("RetryInfo %v, want one: %v", ri, retry)
	}
}

// TestKeyReused: the same key with another request is INVALID_ARGUMENT
// (KEY_REUSED), and the handler does not run.
func TestKeyReused(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		b := setup(t, teststore.Open(t, kind, clock.Now), clock, idemgrpc.Config{}, nil)
		ctx := context.Background()
		if a := call(ctx, b.conn, methodCreate, "k1", newRequest("acct-1", 500, "")); a.err != nil || a.replayed() {
			t.Fatalf("first call: %v, replayed %v", a.err, a.replayed())
		}
		a := call(ctx, b.conn, methodCreate, "k1", newRequest("acct-1", 501, ""))
		checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyReused, false)
		if got := b.svc.runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
		// The same key on another method is another record.
		if a := call(ctx, b.conn, methodGet, "k1", newRequest("acct-1", 501, "")); a.err != nil {
			t.Errorf("same key on another method: %v", a.err)
		}
	})
}

// TestInFlight: a retry while the first call runs gets ABORTED (KEY_IN_USE)
// with a RetryInfo delay; with Guard.Wait it waits and gets the answer.
func TestInFlight(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		for _, wait := range []time.Duration{0, 30 * time.Second} {
			t.Run(fmt.Sprintf("wait=%s", wait), func(t *testing.T) {
				clock := newTestClock()
				store := &watchStore{Store: teststore.Open(t, kind, clock.Now), found: make(chan struct{})}
				b := setup(t, store, clock, idemgrpc.Config{Guard: idem.GuardConfig{Wait: wait}}, nil)
				started, release := make(chan struct{}), make(chan struct{})
				b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
					close(started)
					<-release
					return payment("pay_slow", 500, "acct-1"), nil
				}
				ctx := context.Background()
				first := make(chan answer)
				go func() { first <- call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, "")) }()
				<-started
				if wait == 0 {
					a := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
					checkRefusal(t, a.err, codes.Aborted, idemgrpc.ReasonKeyInUse, true)
					if d, ok := idemgrpc.RetryDelay(a.err); !ok || d < time.Second {
						t.Errorf("RetryDelay %v %v, want at least 1s", d, ok)
					}
					close(release)
				} else {
					second := make(chan answer)
					go func() { second <- call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, "")) }()
					<-store.found // the second call found the record in progress
					close(release)
					a := <-second
					if a.err != nil || !a.replayed() || get(a.reply, "id").String() != "pay_slow" {
						t.Errorf("waiting retry: %v, replayed %v", a.err, a.replayed())
					}
				}
				if a := <-first; a.err != nil || a.replayed() {
					t.Errorf("first call: %v, replayed %v", a.err, a.replayed())
				}
				if got := b.svc.runs.Load(); got != 1 {
					t.Errorf("handler ran %d times, want 1", got)
				}
			})
		}
	})
}

// watchStore closes found the first time a reservation finds an existing
// record.
type watchStore struct {
	idemstore.Store
	found chan struct{}
	once  sync.Once
}

func (s *watchStore) KeyReserve(ctx context.Context, p *idemstore.ReserveParams) (*idemstore.ReserveResult, error) {
	res, err := s.Store.KeyReserve(ctx, p)
	if err == nil && !res.Reserved {
		s.once.Do(func() { close(s.found) })
	}
	return res, err
}

// TestStoreDown: with the store unreachable, a keyed call gets UNAVAILABLE
// (STORE_UNAVAILABLE, with a RetryInfo) and the handler does not run; once
// the store is back, the retry runs it.
func TestStoreDown(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		store := &downStore{Store: teststore.Open(t, kind, clock.Now)}
		b := setup(t, store, clock, idemgrpc.Config{}, nil)
		ctx := context.Background()
		store.down.Store(true)
		a := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
		checkRefusal(t, a.err, codes.Unavailable, idemgrpc.ReasonStoreUnavailable, true)
		if got := b.svc.runs.Load(); got != 0 {
			t.Fatalf("handler ran %d times with the store down, want 0", got)
		}
		store.down.Store(false)
		if a := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, "")); a.err != nil || a.replayed() {
			t.Errorf("after the outage: %v, replayed %v", a.err, a.replayed())
		}
		if got := b.svc.runs.Load(); got != 1 {
			t.Errorf("handler ran %d times, want 1", got)
		}
	})
}

// TestReplay: the first answer has no replay mark; a retry gets the same
// message with idempotent-replayed: true in its header and trailer.
func TestReplay(t *testing.T) {
	t.Parallel()
	teststore.ForEach(t, func(t *testing.T, kind string) {
		clock := newTestClock()
		b := setup(t, teststore.Open(t, kind, clock.Now), clock, idemgrpc.Config{}, nil)
		ctx := context.Background()
		first := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
		if first.err != nil {
			t.Fatal(first.err)
		}
		if len(first.header.Get(idemgrpc.MetadataReplayed)) != 0 || len(first.trailer.Get(idemgrpc.MetadataReplayed)) != 0 {
			t.Errorf("first answer carries %s: header %v trailer %v", idemgrpc.MetadataReplayed, first.header, first.trailer)
		}
		second := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
		if second.err != nil {
			t.Fatal(second.err)
		}
		if got := second.header.Get(idemgrpc.MetadataReplayed); len(got) != 1 || got[0] != "true" {
			t.Errorf("replay header %v", second.header)
		}
		if got := second.trailer.Get(idemgrpc.MetadataReplayed); len(got) != 1 || got[0] != "true" {
			t.Errorf("replay trailer %v", second.trailer)
		}
		if !proto.Equal(first.reply, second.reply) {
			t.Errorf("replay %v differs from the first answer %v", second.reply, first.reply)
		}
	})
}

// TestHandlerErrors: a handler error whose code releases the key lets a
// retry run the handler again; any other is stored and replayed as the same
// status (code, message, details), marked replayed.
func TestHandlerErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		code    codes.Code
		release bool
	}{
		{codes.InvalidArgument, false},
		{codes.FailedPrecondition, false},
		{codes.OutOfRange, false},
		{codes.Unauthenticated, false},
		{codes.PermissionDenied, false},
		{codes.NotFound, false},
		{codes.AlreadyExists, false},
		{codes.Aborted, true},
		{codes.ResourceExhausted, true},
		{codes.Canceled, true},
		{codes.Unknown, true},
		{codes.Internal, true},
		{codes.DataLoss, true},
		{codes.Unimplemented, true},
		{codes.Unavailable, true},
		{codes.DeadlineExceeded, true},
	}
	for _, tt := range tests {
		t.Run(tt.code.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, nil)
			b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
				st, err := status.New(tt.code, "declined by the handler").WithDetails(&errdetails.BadRequest{
					FieldViolations: []*errdetails.BadRequest_FieldViolation{{Field: "amount_cents", Description: "too large"}},
				})
				if err != nil {
					t.Fatal(err)
				}
				return nil, st.Err()
			}
			ctx := context.Background()
			first := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
			second := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
			for _, a := range []answer{first, second} {
				st := status.Convert(a.err)
				if st.Code() != tt.code || st.Message() != "declined by the handler" || len(st.Details()) != 1 {
					t.Fatalf("answer %v, want the handler's status", st.Proto())
				}
				if _, ok := st.Details()[0].(*errdetails.BadRequest); !ok {
					t.Errorf("details %v, want the handler's BadRequest", st.Details())
				}
			}
			wantRuns := int64(1)
			if tt.release {
				wantRuns = 2
			}
			if got := b.svc.runs.Load(); got != wantRuns {
				t.Errorf("handler ran %d times, want %d", got, wantRuns)
			}
			if second.replayed() == tt.release {
				t.Errorf("second answer replayed %v, want %v", second.replayed(), !tt.release)
			}
			if got := idemgrpc.DefaultRelease(status.New(tt.code, "")); got != tt.release {
				t.Errorf("DefaultRelease(%s) = %v, want %v", tt.code, got, tt.release)
			}
		})
	}
}

// TestDefaultRelease pins the table of the package documentation: the
// codes HTTP maps to 5xx or 429 release, the other 4xx are stored, and
// ABORTED releases although HTTP maps it to 409.
func TestDefaultRelease(t *testing.T) {
	t.Parallel()
	for c := codes.OK; c <= codes.Unauthenticated; c++ {
		h := idemgrpc.HTTPStatus(c)
		want := h >= 500 || h == 429 || h == 499 || c == codes.Aborted
		if got := idemgrpc.DefaultRelease(status.New(c, "")); got != want {
			t.Errorf("DefaultRelease(%s) = %v, want %v (HTTP %d)", c, got, want, h)
		}
	}
	for c, want := range map[codes.Code]int{codes.OK: 200, codes.Canceled: 499, codes.InvalidArgument: 400, codes.NotFound: 404,
		codes.AlreadyExists: 409, codes.PermissionDenied: 403, codes.Unauthenticated: 401, codes.ResourceExhausted: 429,
		codes.FailedPrecondition: 400, codes.Aborted: 409, codes.OutOfRange: 400, codes.Unimplemented: 501, codes.Internal: 500,
		codes.Unavailable: 503, codes.DataLoss: 500, codes.DeadlineExceeded: 504, codes.Unknown: 500} {
		if got := idemgrpc.HTTPStatus(c); got != want {
			t.Errorf("HTTPStatus(%s) = %d, want %d", c, got, want)
		}
	}
}

// TestStoredStatusRecord: a stored error keeps the exact gRPC code in the
// record's metadata and its HTTP equivalent as the record's status.
func TestStoredStatusRecord(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	b := setup(t, store, nil, idemgrpc.Config{}, nil)
	b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
		return nil, status.Error(codes.FailedPrecondition, "account closed")
	}
	ctx := context.Background()
	call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
	rec, err := store.KeyGet(ctx, idemstore.Identity{Endpoint: methodCreate, Key: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if rec.Response.Status != 400 || fmt.Sprint(rec.Response.Header["Grpc-Status"]) != "[9]" {
		t.Errorf("stored status %d, metadata %v", rec.Response.Status, rec.Response.Header)
	}
}

// TestMarkUnknownAndReject: a handler that calls idem.MarkUnknown leaves
// the record unknown (FAILED_PRECONDITION, OUTCOME_UNKNOWN, never run
// again); one that calls idem.Reject drops it, so the corrected request
// may reuse the key.
func TestMarkUnknownAndReject(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{}, nil)
	b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
		switch get(req, "account").String() {
		case "timeout":
			idem.MarkUnknown(ctx)
			return nil, status.Error(codes.Unavailable, "the bank did not answer")
		case "invalid":
			idem.Reject(ctx)
			return nil, status.Error(codes.InvalidArgument, "no such account")
		}
		return payment("pay_ok", 1, "acct"), nil
	}
	ctx := context.Background()
	call(ctx, b.conn, methodCreate, "u", newRequest("timeout", 1, ""))
	a := call(ctx, b.conn, methodCreate, "u", newRequest("timeout", 1, ""))
	checkRefusal(t, a.err, codes.FailedPrecondition, idemgrpc.ReasonOutcomeUnknown, true)

	if a := call(ctx, b.conn, methodCreate, "r", newRequest("invalid", 1, "")); status.Code(a.err) != codes.InvalidArgument {
		t.Fatalf("rejected call: %v", a.err)
	}
	if a := call(ctx, b.conn, methodCreate, "r", newRequest("acct", 1, "")); a.err != nil || a.replayed() {
		t.Errorf("corrected request with the rejected key: %v, replayed %v", a.err, a.replayed())
	}
	if got := b.svc.runs.Load(); got != 3 {
		t.Errorf("handler ran %d times, want 3", got)
	}
}

// TestKeyField: the key comes from the request_id field (AIP-155) when the
// metadata has none; metadata and field must agree; without a key a call
// passes through, or is refused with RequireKey; an invalid key is refused.
func TestKeyField(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	b := setup(t, store, nil, idemgrpc.Config{KeyField: "request_id"}, nil)
	ctx := context.Background()
	id := uuid.NewString()
	first := call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, id))
	second := call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, id))
	if first.err != nil || second.err != nil || first.replayed() || !second.replayed() {
		t.Fatalf("request_id calls: %v / %v, replayed %v / %v", first.err, second.err, first.replayed(), second.replayed())
	}
	if _, err := store.KeyGet(ctx, idemstore.Identity{Endpoint: methodCreate, Key: id}); err != nil {
		t.Errorf("no record under the request_id: %v", err)
	}
	if a := call(ctx, b.conn, methodCreate, id, newRequest("acct-1", 500, id)); a.err != nil || !a.replayed() {
		t.Errorf("metadata and field agreeing: %v, replayed %v", a.err, a.replayed())
	}
	a := call(ctx, b.conn, methodCreate, "other", newRequest("acct-1", 500, id))
	checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid, false)

	runs := b.svc.runs.Load()
	call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	if got := b.svc.runs.Load() - runs; got != 2 {
		t.Errorf("calls without a key ran %d times, want 2 (unprotected)", got)
	}
	for _, bad := range []string{strings.Repeat("x", 300), "tab\tkey", "naïve"} {
		a := call(ctx, b.conn, methodCreate, "", newRequest("acct-1", 500, bad))
		checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid, false)
	}

	req := setup(t, idemmem.New(nil), nil, idemgrpc.Config{RequireKey: true}, nil)
	a = call(ctx, req.conn, methodCreate, "", newRequest("acct-1", 500, ""))
	checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyMissing, false)
	if got := req.svc.runs.Load(); got != 0 {
		t.Errorf("handler ran %d times without a required key", got)
	}
	a = call(ctx, req.conn, methodCreate, `"unterminated`, newRequest("acct-1", 500, ""))
	checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyInvalid, false)
}

// TestCoverage: methods outside Config.Methods (or refused by
// Config.Covered) pass through, key or not.
func TestCoverage(t *testing.T) {
	t.Parallel()
	for name, cfg := range map[string]idemgrpc.Config{
		"methods": {Methods: []string{methodCreate}},
		"covered": {Covered: func(m string) bool { return m == methodCreate }},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t, idemmem.New(nil), nil, cfg, nil)
			ctx := context.Background()
			for range 2 {
				call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
				if a := call(ctx, b.conn, methodGet, "k", newRequest("acct-1", 500, "")); a.err != nil || a.replayed() {
					t.Errorf("uncovered call: %v, replayed %v", a.err, a.replayed())
				}
			}
			if got := b.svc.runs.Load(); got != 3 {
				t.Errorf("handler ran %d times, want 3 (one covered, two uncovered)", got)
			}
		})
	}
}

// TestScope: the record's identity is (scope, full method, key); the same
// key in another scope is another record; a failing Scope answers
// UNAUTHENTICATED without running the handler.
func TestScope(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	b := setup(t, store, nil, idemgrpc.Config{Scope: func(ctx context.Context, method string) (string, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		if tenant := firstOf(md.Get("tenant")); tenant != "" {
			return tenant, nil
		}
		return "", errors.New("no tenant")
	}}, nil)
	ctx := context.Background()
	for _, tenant := range []string{"t1", "t2", "t1"} {
		if a := call(metadata.AppendToOutgoingContext(ctx, "tenant", tenant), b.conn, methodCreate, "k", newRequest("acct-1", 500, "")); a.err != nil {
			t.Fatal(a.err)
		}
	}
	if got := b.svc.runs.Load(); got != 2 {
		t.Errorf("handler ran %d times, want 2 (one per tenant)", got)
	}
	for _, tenant := range []string{"t1", "t2"} {
		rec, err := store.KeyGet(ctx, idemstore.Identity{Scope: tenant, Endpoint: methodCreate, Key: "k"})
		if err != nil || rec.State != idemstore.StateCompleted {
			t.Errorf("record of %s: %v", tenant, err)
		}
	}
	a := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
	if st := status.Convert(a.err); st.Code() != codes.Unauthenticated || st.Message() != "unauthenticated" {
		t.Errorf("no tenant: %v", a.err)
	}
}

// TestFingerprint: the fingerprint is the deterministic encoding, so map
// order does not matter; excluded fields do not count; any other change
// does.
func TestFingerprint(t *testing.T) {
	t.Parallel()
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{FingerprintExclude: []string{"sent_at"}}, nil)
	ctx := context.Background()
	withLabels := func(sentAt string, kv ...string) *dynamicpb.Message {
		m := newRequest("acct-1", 500, "")
		set(m, "sent_at", protoreflect.ValueOfString(sentAt))
		labels := m.Mutable(requestDesc.Fields().ByName("labels")).Map()
		for i := 0; i < len(kv); i += 2 {
			labels.Set(protoreflect.ValueOfString(kv[i]).MapKey(), protoreflect.ValueOfString(kv[i+1]))
		}
		return m
	}
	labels := []string{"a", "1", "b", "2", "c", "3", "d", "4", "e", "5", "f", "6", "g", "7", "h", "8"}
	if a := call(ctx, b.conn, methodCreate, "k", withLabels("10:00", labels...)); a.err != nil {
		t.Fatal(a.err)
	}
	for i := range 10 { // map iteration order varies between encodings
		if a := call(ctx, b.conn, methodCreate, "k", withLabels(fmt.Sprintf("10:%02d", i), labels...)); a.err != nil || !a.replayed() {
			t.Fatalf("same request, other sent_at: %v, replayed %v", a.err, a.replayed())
		}
	}
	a := call(ctx, b.conn, methodCreate, "k", withLabels("10:00", append(labels, "i", "9")...))
	checkRefusal(t, a.err, codes.InvalidArgument, idemgrpc.ReasonKeyReused, false)
}

// TestReplayUnknownType: without a resolver for the response type, a
// replay sends the stored bytes, which the client decodes as the original.
func TestReplayUnknownType(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	cfg := idemgrpc.Config{Resolver: emptyResolver{}}
	b := setup(t, store, nil, cfg, nil)
	ctx := context.Background()
	first := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
	second := call(ctx, b.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
	if first.err != nil || second.err != nil || !second.replayed() || !proto.Equal(first.reply, second.reply) {
		t.Errorf("replay of an unresolved type: %v / %v, %v vs %v", first.err, second.err, first.reply, second.reply)
	}
}

type emptyResolver struct{}

func (emptyResolver) FindMessageByName(protoreflect.FullName) (protoreflect.MessageType, error) {
	return nil, errors.New("not found")
}

func (emptyResolver) FindMessageByURL(string) (protoreflect.MessageType, error) {
	return nil, errors.New("not found")
}

// TestTransactional: in transactional mode a handler error that releases
// the key rolls back, and a stored one commits with the completion.
func TestTransactional(t *testing.T) {
	t.Parallel()
	for _, kind := range []string{"sqlite", "postgres", "mysql"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel()
			clock := newTestClock()
			store := teststore.Open(t, kind, clock.Now)
			b := setup(t, store, clock, idemgrpc.Config{Guard: idem.GuardConfig{Transactional: true}}, nil)
			var fail atomic.Bool
			b.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
				if _, err := idemstore.TxFromContext(ctx); err != nil {
					t.Error("no business transaction in the handler's context")
				}
				if fail.Load() {
					return nil, status.Error(codes.Unavailable, "try again")
				}
				return payment("pay_tx", 1, "acct"), nil
			}
			ctx := context.Background()
			fail.Store(true)
			call(ctx, b.conn, methodCreate, "k", newRequest("acct", 1, ""))
			fail.Store(false)
			if a := call(ctx, b.conn, methodCreate, "k", newRequest("acct", 1, "")); a.err != nil || a.replayed() {
				t.Errorf("after a released attempt: %v, replayed %v", a.err, a.replayed())
			}
			if a := call(ctx, b.conn, methodCreate, "k", newRequest("acct", 1, "")); a.err != nil || !a.replayed() {
				t.Errorf("replay: %v, replayed %v", a.err, a.replayed())
			}
			if got := b.svc.runs.Load(); got != 2 {
				t.Errorf("handler ran %d times, want 2", got)
			}
		})
	}
}

var _ grpc.UnaryServerInterceptor = idemgrpc.UnaryServerInterceptor(idemmem.New(nil), nil)

// TestNotReplayableAndLimits: an answer over Guard.MaxResponse is
// delivered once and a retry gets FAILED_PRECONDITION (NOT_REPLAYABLE),
// never a second run; a per-scope limit answers RESOURCE_EXHAUSTED
// (TOO_MANY_KEYS) with a RetryInfo.
func TestNotReplayableAndLimits(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b := setup(t, idemmem.New(nil), nil, idemgrpc.Config{Guard: idem.GuardConfig{MaxResponse: 4}}, nil)
	if a := call(ctx, b.conn, methodCreate, "big", newRequest("acct-1", 500, "")); a.err != nil {
		t.Fatal(a.err)
	}
	a := call(ctx, b.conn, methodCreate, "big", newRequest("acct-1", 500, ""))
	checkRefusal(t, a.err, codes.FailedPrecondition, idemgrpc.ReasonNotReplayable, false)
	if got := b.svc.runs.Load(); got != 1 {
		t.Errorf("handler ran %d times, want 1", got)
	}

	l := setup(t, idemmem.New(nil), nil, idemgrpc.Config{Guard: idem.GuardConfig{MaxInProgressPerScope: 1}}, nil)
	started, release := make(chan struct{}), make(chan struct{})
	l.svc.handle = func(ctx context.Context, req *dynamicpb.Message) (proto.Message, error) {
		close(started)
		<-release
		return payment("pay", 1, "acct"), nil
	}
	first := make(chan answer)
	go func() { first <- call(ctx, l.conn, methodCreate, "k1", newRequest("acct-1", 500, "")) }()
	<-started
	a = call(ctx, l.conn, methodCreate, "k2", newRequest("acct-1", 500, ""))
	checkRefusal(t, a.err, codes.ResourceExhausted, idemgrpc.ReasonTooManyKeys, true)
	close(release)
	if a := <-first; a.err != nil {
		t.Error(a.err)
	}
}

// TestResponseUntrusted: a completed call whose stored answer fails
// verification (here stored in the clear, and refused by
// EncryptionRequired) is refused with DATA_LOSS (RESPONSE_UNTRUSTED),
// without a RetryInfo, and the handler never runs again: not UNAVAILABLE
// (STORE_UNAVAILABLE), which says the call was not processed and which
// clients retry.
func TestResponseUntrusted(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	store := idemmem.New(&idemmem.Config{Now: clock.Now})
	clear := setup(t, store, clock, idemgrpc.Config{}, nil)
	ctx := context.Background()
	if a := call(ctx, clear.conn, methodCreate, "k", newRequest("acct-1", 500, "")); a.err != nil {
		t.Fatal(a.err)
	}
	secret := make([]byte, idemcrypt.KeySize)
	rand.Read(secret)
	kr, err := idemcrypt.NewKeyring(idemcrypt.Key{Name: "k1", Secret: secret})
	if err != nil {
		t.Fatal(err)
	}
	sealed := setup(t, store, clock, idemgrpc.Config{Guard: idem.GuardConfig{Keyring: kr, EncryptionRequired: true}}, nil)
	a := call(ctx, sealed.conn, methodCreate, "k", newRequest("acct-1", 500, ""))
	checkRefusal(t, a.err, codes.DataLoss, idemgrpc.ReasonResponseUntrusted, false)
	if got := sealed.svc.runs.Load(); got != 0 {
		t.Errorf("handler ran %d times on a completed call, want 0", got)
	}
}
