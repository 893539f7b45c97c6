package keyadmin_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/keyadmin"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

var id = idemstore.Identity{Scope: "acme", Endpoint: "POST /v1/payments", Key: "k-unknown"}

// setup returns a store holding one unknown record under id, and its token.
func setup(t *testing.T) (idemstore.Store, string) {
	t.Helper()
	ctx := t.Context()
	clock := idemtest.NewClock(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	store := idemmem.New(&idemmem.Config{Now: clock.Now})
	_, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp", Token: "t1", Lease: time.Minute, TTL: time.Hour})
	if err == nil {
		err = store.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: id, Token: "t1"})
	}
	if err != nil {
		t.Fatal(err)
	}
	return store, "t1"
}

func audit(r *keyadmin.Resolution) string {
	var b bytes.Buffer
	slog.New(slog.NewTextHandler(&b, nil)).LogAttrs(context.Background(), slog.LevelInfo, "resolved", r.Audit()...)
	_, line, _ := strings.Cut(strings.TrimSuffix(b.String(), "\n"), "msg=resolved ")
	return line
}

func TestResolve(t *testing.T) {
	t.Parallel()
	created := &idemstore.Response{Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_9"}`)}
	for _, tt := range []struct {
		name      string
		to        idemstore.State
		resp      *idemstore.Response
		wantAudit string
	}{
		{"completed", idemstore.StateCompleted, created,
			`action=resolve key_hash=` + id.LogHash() + ` endpoint="POST /v1/payments" scope=acme from=unknown to=completed operator=alice status=201`},
		{"completed not replayable", idemstore.StateCompleted, nil,
			`action=resolve key_hash=` + id.LogHash() + ` endpoint="POST /v1/payments" scope=acme from=unknown to=completed operator=alice`},
		{"released", idemstore.StateReleased, nil,
			`action=resolve key_hash=` + id.LogHash() + ` endpoint="POST /v1/payments" scope=acme from=unknown to=released operator=alice`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, token := setup(t)
			r := &keyadmin.Resolution{Identity: id, Token: token, To: tt.to, Response: tt.resp, Operator: "alice"}
			if err := keyadmin.Resolve(t.Context(), store, r); err != nil {
				t.Fatalf("Resolve: %v", err)
			}
			rec, err := store.KeyGet(t.Context(), id)
			if err != nil || rec.State != tt.to {
				t.Fatalf("record after Resolve = %+v, %v; want %s", rec, err, tt.to)
			}
			if tt.to == idemstore.StateCompleted && (rec.NotReplayable != (tt.resp == nil) ||
				tt.resp != nil && (rec.Response == nil || rec.Response.Status != tt.resp.Status || !bytes.Equal(rec.Response.Body, tt.resp.Body))) {
				t.Errorf("stored response = %+v, not replayable %v; want %+v", rec.Response, rec.NotReplayable, tt.resp)
			}
			if got := audit(r); got != tt.wantAudit {
				t.Errorf("audit line\n got %s\nwant %s", got, tt.wantAudit)
			}
			if strings.Contains(audit(r), id.Key) {
				t.Errorf("the audit line names the key: %s", audit(r))
			}
		})
	}
}

// A resolution that is not one is refused before the store is written.
func TestResolveInvalid(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		to   idemstore.State
		resp *idemstore.Response
	}{
		{"no target", "", nil},
		{"in_progress", idemstore.StateInProgress, nil},
		{"unknown", idemstore.StateUnknown, nil},
		{"released with a response", idemstore.StateReleased, &idemstore.Response{Status: 200}},
		{"status 0", idemstore.StateCompleted, &idemstore.Response{}},
		{"status 99", idemstore.StateCompleted, &idemstore.Response{Status: 99}},
		{"status 600", idemstore.StateCompleted, &idemstore.Response{Status: 600}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			store, token := setup(t)
			err := keyadmin.Resolve(t.Context(), store, &keyadmin.Resolution{Identity: id, Token: token, To: tt.to, Response: tt.resp})
			if !errors.Is(err, keyadmin.ErrInvalid) || keyadmin.Changed(err) {
				t.Errorf("Resolve = %v, want ErrInvalid", err)
			}
			if rec, err := store.KeyGet(t.Context(), id); err != nil || rec.State != idemstore.StateUnknown {
				t.Errorf("record after a refused resolution = %+v, %v; want it unknown", rec, err)
			}
		})
	}
}

// A resolution is fenced on the token the operator read: a record that
// changed or went away is left as it is, and the error says which.
func TestResolveFenced(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store, token := setup(t)
	released := &keyadmin.Resolution{Identity: id, Token: token, To: idemstore.StateReleased}

	stale := *released
	stale.Token = "another attempt's"
	if err := keyadmin.Resolve(ctx, store, &stale); !keyadmin.Changed(err) || !errors.Is(err, idemstore.ErrLeaseLost) {
		t.Errorf("Resolve with a stale token = %v, want a change (ErrLeaseLost)", err)
	}
	if rec, err := store.KeyGet(ctx, id); err != nil || rec.State != idemstore.StateUnknown {
		t.Fatalf("record after a stale resolution = %+v, %v; want it unknown", rec, err)
	}
	if err := keyadmin.Resolve(ctx, store, released); err != nil {
		t.Fatal(err)
	}
	// Resolved already (by another operator): no longer unknown.
	if err := keyadmin.Resolve(ctx, store, released); !keyadmin.Changed(err) {
		t.Errorf("Resolve of a released record = %v, want a change", err)
	}
	if _, err := store.KeyPurge(ctx, &idemstore.PurgeParams{Identity: id}); err != nil {
		t.Fatal(err)
	}
	if err := keyadmin.Resolve(ctx, store, released); !errors.Is(err, idemstore.ErrNotFound) || keyadmin.Changed(err) {
		t.Errorf("Resolve of a purged record = %v, want ErrNotFound", err)
	}
}
