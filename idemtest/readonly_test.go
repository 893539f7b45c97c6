package idemtest_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// recordingT collects what CheckReserveResults reports instead of failing.
type recordingT struct {
	testing.TB
	errors   []string
	cleanups []func()
}

func (r *recordingT) Helper()          {}
func (r *recordingT) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recordingT) Errorf(format string, a ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, a...))
}

// end runs the cleanups, as the end of a test does.
func (r *recordingT) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// TestCheckReserveResults: a change to a record KeyReserve returned, in any
// field, its headers or its body, fails the test and is named; reading it
// does not. idemmem shares a completed record with every replay, so the
// change would reach the store.
func TestCheckReserveResults(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name   string
		change func(*idemstore.Record)
		want   string // the field named; "" for no failure
	}{
		{"read only", func(r *idemstore.Record) { _ = r.Response.Header.Get("Content-Type") + string(r.Response.Body) }, ""},
		{"state", func(r *idemstore.Record) { r.State = idemstore.StateReleased }, "(State)"},
		{"attempts", func(r *idemstore.Record) { r.Attempts++ }, "(Attempts)"},
		{"header value", func(r *idemstore.Record) { r.Response.Header["Location"][0] = "/v1/other" }, "(Response)"},
		{"header added", func(r *idemstore.Record) { r.Response.Header.Set("Idempotent-Replayed", "true") }, "(Response)"},
		{"body byte", func(r *idemstore.Record) { r.Response.Body[0] = '[' }, "(Response)"},
		{"response dropped", func(r *idemstore.Record) { r.Response = nil }, "(Response)"},
		{"identity", func(r *idemstore.Record) { r.Key = "another" }, "(Identity)"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			rt := &recordingT{TB: t}
			store := idemtest.CheckReserveResults(rt, idemmem.New(nil))
			id := idemstore.Identity{Scope: "s", Endpoint: "POST /v1/things", Key: "k"}
			params := &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t1", Lease: time.Minute, TTL: time.Hour}
			if _, err := store.KeyReserve(ctx, params); err != nil {
				t.Fatal(err)
			}
			resp := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Location": {"/v1/things/1"}}, Body: []byte(`{"id":1}`)}
			if err := store.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: "t1", Response: resp}); err != nil {
				t.Fatal(err)
			}
			params.Token = "t2"
			res, err := store.KeyReserve(ctx, params) // a replay
			if err != nil || res.Reserved || res.Record.State != idemstore.StateCompleted {
				t.Fatalf("replay = %+v, %v", res, err)
			}
			tt.change(res.Record)
			rt.end()
			switch {
			case tt.want == "" && len(rt.errors) > 0:
				t.Errorf("reading the record was reported: %q", rt.errors)
			case tt.want != "" && (len(rt.errors) != 1 || !strings.Contains(rt.errors[0], tt.want)):
				t.Errorf("reported %q; want one failure naming %s", rt.errors, tt.want)
			}
		})
	}
}

// A wrapped store keeps the Waiter and TxStore methods of the store it
// wraps, and gains none.
func TestCheckReserveResultsKeepsInterfaces(t *testing.T) {
	t.Parallel()
	mem := idemmem.New(nil)
	for _, tt := range []struct {
		name         string
		store        idemstore.Store
		waiter, txer bool
	}{
		{"memory store", mem, true, true},
		{"transactions only", txOnly{plain{mem}}, false, true},
		{"neither", plain{mem}, false, false},
	} {
		store := idemtest.CheckReserveResults(t, tt.store)
		if _, ok := store.(idemstore.Waiter); ok != tt.waiter {
			t.Errorf("%s: wrapped, implements Waiter = %v, want %v", tt.name, ok, tt.waiter)
		}
		if _, ok := store.(idemstore.TxStore); ok != tt.txer {
			t.Errorf("%s: wrapped, implements TxStore = %v, want %v", tt.name, ok, tt.txer)
		}
	}
}

// plain is a store with no optional method.
type plain struct{ idemstore.Store }

// txOnly is a store with transactions and no KeyWait.
type txOnly struct{ plain }

func (txOnly) KeyBeginTx(context.Context) (idemstore.Tx, error) { return nil, nil }
