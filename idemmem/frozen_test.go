package idemmem

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// sameRecord reports how a differs from b: their times by the instant,
// the rest exactly.
func sameRecord(t *testing.T, got, want *idemstore.Record) {
	t.Helper()
	g, w := *got, *want
	for _, tm := range []struct {
		name   string
		gt, wt *time.Time
	}{
		{"LockedUntil", &g.LockedUntil, &w.LockedUntil}, {"StartedAt", &g.StartedAt, &w.StartedAt},
		{"CreatedAt", &g.CreatedAt, &w.CreatedAt}, {"UpdatedAt", &g.UpdatedAt, &w.UpdatedAt},
		{"ExpiresAt", &g.ExpiresAt, &w.ExpiresAt}, {"ReconcileAfter", &g.ReconcileAfter, &w.ReconcileAfter},
	} {
		if !tm.gt.Equal(*tm.wt) || tm.gt.IsZero() != tm.wt.IsZero() {
			t.Errorf("%s = %v, want %v", tm.name, *tm.gt, *tm.wt)
		}
		*tm.gt, *tm.wt = time.Time{}, time.Time{}
	}
	if (g.Response == nil) != (w.Response == nil) {
		t.Fatalf("Response = %v, want %v", g.Response, w.Response)
	}
	if g.Response != nil {
		if !reflect.DeepEqual(*g.Response, *w.Response) {
			t.Errorf("Response = %+v, want %+v", *g.Response, *w.Response)
		}
		g.Response, w.Response = nil, nil
	}
	if !reflect.DeepEqual(g, w) {
		t.Errorf("record = %+v, want %+v", g, w)
	}
}

func TestFreezeThaw(t *testing.T) {
	t.Parallel()
	now := time.Now()
	full := idemstore.Record{
		Identity:          idemstore.Identity{Scope: "tenant", Endpoint: "POST /v1/payments", Key: "k-1"},
		Fingerprint:       strings.Repeat("ab", 32),
		State:             idemstore.StateCompleted,
		Token:             "token",
		LockedUntil:       now.Add(time.Minute),
		StartedAt:         now,
		LeaseExpiredState: idemstore.StateReleased,
		RecoveryPoint:     "charged",
		Attempts:          3,
		CreatedAt:         now.Add(-time.Hour),
		UpdatedAt:         now.Add(time.Second),
		ExpiresAt:         now.Add(24 * time.Hour),
		TTL:               24 * time.Hour,
		ReconcileAfter:    time.Date(2026, 1, 2, 3, 4, 5, 6, time.FixedZone("", 3600)),
		ReconcileAttempts: 2,
		ReconcileError:    "upstream: 502 ☃",
		Response: &idemstore.Response{
			Status: http.StatusCreated,
			Header: http.Header{"Content-Type": {"application/json"}, "Etag": {`"1"`, ""}, "X-Empty": {}},
			Body:   []byte(`{"id":"pay_1"}`),
		},
	}
	tests := []struct {
		name string
		edit func(r *idemstore.Record)
	}{
		{"full", func(*idemstore.Record) {}},
		{"zero times, UTC", func(r *idemstore.Record) {
			r.LockedUntil, r.StartedAt, r.ReconcileAfter = time.Time{}, time.Time{}, time.Time{}
			r.CreatedAt, r.ExpiresAt = r.CreatedAt.UTC(), time.Date(2026, 5, 1, 0, 0, 0, 999, time.UTC)
		}},
		{"not replayable", func(r *idemstore.Record) { r.NotReplayable, r.Response = true, nil }},
		{"nil header, empty body", func(r *idemstore.Record) {
			r.Response = &idemstore.Response{Status: http.StatusNoContent}
		}},
		{"empty header", func(r *idemstore.Record) {
			r.Response = &idemstore.Response{Status: 200, Header: http.Header{}, Body: []byte("x")}
		}},
		{"sealed", func(r *idemstore.Record) {
			r.Response = &idemstore.Response{Status: 200, Body: []byte{0, 1, 2, 255}, Sealed: "v2 k1"}
		}},
		{"long strings", func(r *idemstore.Record) {
			r.Key = strings.Repeat("k", 255)
			r.Response = &idemstore.Response{Status: 200, Header: http.Header{"Location": {strings.Repeat("/l", 500)}}, Body: make([]byte, 70000)}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			want := full
			if want.Response != nil {
				resp := *want.Response
				want.Response = &resp
			}
			tt.edit(&want)
			for _, shared := range []bool{true, false} {
				var table headerTable
				f := freeze(nil, &want, &table)
				from := &table
				if !shared {
					from = nil // thaw parses the header
				}
				got := f.thaw(from)
				if h := want.Response; !shared && h != nil && h.Header != nil && reflect.ValueOf(got.Response.Header).UnsafePointer() == reflect.ValueOf(table.sets[string(appendHeaderKey(nil, h.Header))]).UnsafePointer() {
					t.Error("thaw(nil) shares the table's header")
				}
				sameRecord(t, &got.Record, &want)
				if !f.is(want.Identity) || f.identity() != want.Identity {
					t.Errorf("identity %+v, want %+v", f.identity(), want.Identity)
				}
				for _, edit := range []func(*idemstore.Identity){
					func(id *idemstore.Identity) { id.Key += "x" },
					func(id *idemstore.Identity) { id.Key = id.Key[:len(id.Key)-1] + "x" }, // same length
					func(id *idemstore.Identity) { id.Scope += "x" },
					func(id *idemstore.Identity) { id.Endpoint = "x" + id.Endpoint[1:] },
				} {
					other := want.Identity
					edit(&other)
					if f.is(other) {
						t.Errorf("is(%+v) = true", other)
					}
				}
				if !f.expiresAt().Equal(want.ExpiresAt) || f.expired(want.ExpiresAt.Add(-1)) || !f.expired(want.ExpiresAt) {
					t.Errorf("expiresAt %v, want %v", f.expiresAt(), want.ExpiresAt)
				}
			}
		})
	}
}
