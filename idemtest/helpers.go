package idemtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/testenv"
)

// Parameters every subtest uses unless it says otherwise. All durations are
// whole milliseconds so that stores with millisecond or microsecond time
// columns round-trip them exactly.
const (
	testLease        = 30 * time.Second
	testTTL          = 24 * time.Hour
	testFingerprint  = "f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0f0"
	otherFingerprint = "0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a0a"

	// concurrency is the number of goroutines racing in concurrency tests.
	concurrency = 200
)

// bundle is what setup gives every subtest.
type bundle struct {
	store idemstore.Store
	clock *Clock
	ctx   context.Context
	// id is an identity no other record in the store uses.
	id     idemstore.Identity
	tokens atomic.Int64
}

// token returns a fencing token unique within the bundle.
func (b *bundle) token() string {
	return fmt.Sprintf("token-%04d", b.tokens.Add(1))
}

// params returns ReserveParams for id with the suite's defaults and a fresh
// token.
func (b *bundle) params(id idemstore.Identity) *idemstore.ReserveParams {
	return &idemstore.ReserveParams{
		Identity:          id,
		Fingerprint:       testFingerprint,
		Token:             b.token(),
		Lease:             testLease,
		TTL:               testTTL,
		LeaseExpiredState: idemstore.StateUnknown,
	}
}

// reserve calls KeyReserve and fails the test on error.
func (b *bundle) reserve(t *testing.T, p *idemstore.ReserveParams) *idemstore.ReserveResult {
	t.Helper()
	res, err := b.store.KeyReserve(b.ctx, p)
	if err != nil {
		t.Fatalf("KeyReserve(%+v): %v", p.Identity, err)
	}
	if res == nil || res.Record == nil {
		t.Fatalf("KeyReserve(%+v) returned no record", p.Identity)
	}
	return res
}

// reserveNew reserves p and fails unless it got the lease.
func (b *bundle) reserveNew(t *testing.T, p *idemstore.ReserveParams) *idemstore.Record {
	t.Helper()
	res := b.reserve(t, p)
	if !res.Reserved {
		t.Fatalf("KeyReserve(%+v): Reserved = false, want true (record state %s)", p.Identity, res.Record.State)
	}
	return res.Record
}

// reserveExisting reserves p and fails if it got the lease.
func (b *bundle) reserveExisting(t *testing.T, p *idemstore.ReserveParams) *idemstore.Record {
	t.Helper()
	res := b.reserve(t, p)
	if res.Reserved {
		t.Fatalf("KeyReserve(%+v): Reserved = true, want false", p.Identity)
	}
	return res.Record
}

// get calls KeyGet and fails the test on error.
func (b *bundle) get(t *testing.T, id idemstore.Identity) *idemstore.Record {
	t.Helper()
	r, err := b.store.KeyGet(b.ctx, id)
	if err != nil {
		t.Fatalf("KeyGet(%+v): %v", id, err)
	}
	if r == nil {
		t.Fatalf("KeyGet(%+v) returned a nil record", id)
	}
	return r
}

// requireNotFound fails unless KeyGet(id) reports ErrNotFound.
func (b *bundle) requireNotFound(t *testing.T, id idemstore.Identity) {
	t.Helper()
	r, err := b.store.KeyGet(b.ctx, id)
	if !errors.Is(err, idemstore.ErrNotFound) {
		t.Fatalf("KeyGet(%+v) = %+v, %v; want ErrNotFound", id, r, err)
	}
}

// complete completes the attempt with resp and fails the test on error.
func (b *bundle) complete(t *testing.T, id idemstore.Identity, token string, resp *idemstore.Response) {
	t.Helper()
	if err := b.store.KeyComplete(b.ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
		t.Fatalf("KeyComplete(%+v): %v", id, err)
	}
}

// release releases the attempt and fails the test on error.
func (b *bundle) release(t *testing.T, id idemstore.Identity, token string) {
	t.Helper()
	if err := b.store.KeyRelease(b.ctx, &idemstore.FinishParams{Identity: id, Token: token}); err != nil {
		t.Fatalf("KeyRelease(%+v): %v", id, err)
	}
}

// markUnknown marks the attempt unknown and fails the test on error.
func (b *bundle) markUnknown(t *testing.T, id idemstore.Identity, token string) {
	t.Helper()
	if err := b.store.KeyMarkUnknown(b.ctx, &idemstore.FinishParams{Identity: id, Token: token}); err != nil {
		t.Fatalf("KeyMarkUnknown(%+v): %v", id, err)
	}
}

// requireErr fails unless errors.Is(err, want).
func requireErr(t *testing.T, what string, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("%s: err = %v, want %v", what, err, want)
	}
}

// requireState fails unless r is in state s.
func requireState(t *testing.T, r *idemstore.Record, s idemstore.State) {
	t.Helper()
	if r.State != s {
		t.Fatalf("record %+v: state = %q, want %q", r.Identity, r.State, s)
	}
}

// requireSameRecord fails when got and want differ in any stored field.
func requireSameRecord(t *testing.T, what string, got, want *idemstore.Record) {
	t.Helper()
	if diff := diffRecords(got, want); len(diff) > 0 {
		t.Fatalf("%s: records differ:\n%s", what, joinLines(diff))
	}
}

func joinLines(lines []string) string {
	var buf bytes.Buffer
	for _, l := range lines {
		buf.WriteString("  ")
		buf.WriteString(l)
		buf.WriteByte('\n')
	}
	return buf.String()
}

// diffRecords lists the fields in which got differs from want. Times are
// compared with Equal, nil and empty headers and bodies are the same.
func diffRecords(got, want *idemstore.Record) []string {
	if got == nil || want == nil {
		if got == want {
			return nil
		}
		return []string{fmt.Sprintf("got %v, want %v", got, want)}
	}
	var d []string
	field := func(name string, g, w any) {
		if g != w {
			d = append(d, fmt.Sprintf("%s: got %v, want %v", name, g, w))
		}
	}
	tm := func(name string, g, w time.Time) {
		if !g.Equal(w) {
			d = append(d, fmt.Sprintf("%s: got %v, want %v", name, g, w))
		}
	}
	field("Identity", got.Identity, want.Identity)
	field("Fingerprint", got.Fingerprint, want.Fingerprint)
	field("State", got.State, want.State)
	field("Token", got.Token, want.Token)
	tm("LockedUntil", got.LockedUntil, want.LockedUntil)
	tm("StartedAt", got.StartedAt, want.StartedAt)
	field("LeaseExpiredState", got.LeaseExpiredState, want.LeaseExpiredState)
	field("NotReplayable", got.NotReplayable, want.NotReplayable)
	field("RecoveryPoint", got.RecoveryPoint, want.RecoveryPoint)
	field("Attempts", got.Attempts, want.Attempts)
	tm("CreatedAt", got.CreatedAt, want.CreatedAt)
	tm("UpdatedAt", got.UpdatedAt, want.UpdatedAt)
	tm("ExpiresAt", got.ExpiresAt, want.ExpiresAt)
	field("TTL", got.TTL, want.TTL)
	tm("ReconcileAfter", got.ReconcileAfter, want.ReconcileAfter)
	field("ReconcileAttempts", got.ReconcileAttempts, want.ReconcileAttempts)
	field("ReconcileError", got.ReconcileError, want.ReconcileError)
	if msg := diffResponses(got.Response, want.Response); msg != "" {
		d = append(d, "Response: "+msg)
	}
	return d
}

// diffResponses describes how got differs from want, or returns "".
func diffResponses(got, want *idemstore.Response) string {
	if got == nil || want == nil {
		if got == nil && want == nil {
			return ""
		}
		return fmt.Sprintf("got %v, want %v", got != nil, want != nil)
	}
	if got.Status != want.Status {
		return fmt.Sprintf("status %d, want %d", got.Status, want.Status)
	}
	if len(got.Header) != 0 || len(want.Header) != 0 {
		if !reflect.DeepEqual(got.Header, want.Header) {
			return fmt.Sprintf("header %v, want %v", got.Header, want.Header)
		}
	}
	if !bytes.Equal(got.Body, want.Body) {
		return fmt.Sprintf("body of %d bytes differs from the %d bytes stored", len(got.Body), len(want.Body))
	}
	return ""
}

// requireResponse fails unless r holds resp.
func requireResponse(t *testing.T, r *idemstore.Record, resp *idemstore.Response) {
	t.Helper()
	if msg := diffResponses(r.Response, resp); msg != "" {
		t.Fatalf("record %+v: response: %s", r.Identity, msg)
	}
}

// sampleResponse is a typical stored response.
func sampleResponse() *idemstore.Response {
	return &idemstore.Response{
		Status: http.StatusCreated,
		Header: http.Header{
			"Content-Type": {"application/json"},
			"Location":     {"/v1/payments/pay_123"},
			"Link":         {"</a>; rel=a", "</b>; rel=b"},
		},
		Body: []byte(`{"id":"pay_123","amount":1000}` + "\n"),
	}
}

// raceReserve has concurrency goroutines reserve id at once, each with its
// own token, and returns their results in order.
func (b *bundle) raceReserve(t *testing.T, id idemstore.Identity, fingerprint string) []*idemstore.ReserveResult {
	t.Helper()
	params := make([]*idemstore.ReserveParams, concurrency)
	for i := range params {
		params[i] = b.params(id)
		params[i].Fingerprint = fingerprint
	}
	results := make([]*idemstore.ReserveResult, concurrency)
	errs := make([]error, concurrency)
	testenv.Race(concurrency, func(i int) {
		results[i], errs[i] = b.store.KeyReserve(b.ctx, params[i])
	})
	for i, err := range errs {
		if err != nil {
			t.Fatalf("KeyReserve #%d: %v", i, err)
		}
		if results[i] == nil || results[i].Record == nil {
			t.Fatalf("KeyReserve #%d returned no record", i)
		}
	}
	return results
}

// requireOneWinner checks that exactly one of results reserved the record
// and that every other one saw the winner's in_progress record. It returns
// the winner's record.
func requireOneWinner(t *testing.T, results []*idemstore.ReserveResult) *idemstore.Record {
	t.Helper()
	var winners []*idemstore.Record
	for _, res := range results {
		if res.Reserved {
			winners = append(winners, res.Record)
		}
	}
	if len(winners) != 1 {
		t.Fatalf("%d of %d concurrent reservations won, want exactly 1", len(winners), len(results))
	}
	w := winners[0]
	requireState(t, w, idemstore.StateInProgress)
	for i, res := range results {
		if res.Reserved {
			continue
		}
		if res.Record.State != idemstore.StateInProgress || res.Record.Token != w.Token {
			t.Fatalf("loser #%d saw state %q token %q, want in_progress with the winner's token %q",
				i, res.Record.State, res.Record.Token, w.Token)
		}
	}
	return w
}
