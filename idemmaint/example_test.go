package idemmaint_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// Example_reconciler settles payments whose outcome is unknown by asking the
// payment provider whether it holds a charge under the key the service sent
// it: idem.DeriveKey(identity, "charge"), the same derived key the handler
// used (idem.DerivedKeyFromContext(ctx, "charge")).
func Example_reconciler() {
	ctx := context.Background()
	clock := idemtest.NewClock(time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC))
	store := idemmem.New(&idemmem.Config{Now: clock.Now})

	paid := idemstore.Identity{Scope: "tenant-1", Endpoint: "POST /v1/payments", Key: "order-1"}
	unpaid := idemstore.Identity{Scope: "tenant-1", Endpoint: "POST /v1/payments", Key: "order-2"}

	// The provider looks charges up by their idempotency key. It charged
	// order-1 before the service crashed; order-2's call never reached it.
	charges := map[string]int{idem.DeriveKey(paid, "charge"): 1250}
	provider := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		amount, ok := charges[r.URL.Query().Get("idempotency_key")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		json.NewEncoder(w).Encode(map[string]int{"amount_cents": amount})
	}))
	defer provider.Close()

	// Both attempts crash while holding their leases.
	for _, id := range []idemstore.Identity{paid, unpaid} {
		_, err := store.KeyReserve(ctx, &idemstore.ReserveParams{
			Identity: id, Fingerprint: "fp-" + id.Key, Token: "token-" + id.Key,
			Lease: 30 * time.Second, TTL: 24 * time.Hour, LeaseExpiredState: idemstore.StateUnknown,
		})
		if err != nil {
			panic(err)
		}
	}
	// The reconciler asks once the leases have ended and its grace has
	// passed (idemmaint.DefaultGrace, a minute): by then the provider has
	// finished with any call it was sent.
	clock.Advance(30*time.Second + idemmaint.DefaultGrace)

	// reconcile asks the provider about one unknown payment.
	reconcile := func(ctx context.Context, rec *idemstore.Record) (idemmaint.Resolution, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet,
			provider.URL+"/charges?idempotency_key="+idem.DeriveKey(rec.Identity, "charge"), nil)
		if err != nil {
			return idemmaint.Resolution{}, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return idemmaint.Resolution{}, err // unresolved: retried after a backoff
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		switch {
		case err != nil:
			return idemmaint.Resolution{}, err
		case resp.StatusCode == http.StatusNotFound:
			// No charge: the payment never happened, a retry may run it.
			return idemmaint.Resolution{State: idemstore.StateReleased}, nil
		case resp.StatusCode != http.StatusOK:
			return idemmaint.Resolution{}, fmt.Errorf("provider answered %s", resp.Status)
		}
		var charge struct {
			AmountCents int `json:"amount_cents"`
		}
		if err := json.Unmarshal(body, &charge); err != nil {
			return idemmaint.Resolution{}, err
		}
		// The charge happened: store the response a retry replays.
		return idemmaint.Resolution{
			State: idemstore.StateCompleted,
			Response: &idemstore.Response{
				Status: http.StatusCreated,
				Header: http.Header{"Content-Type": {"application/json"}},
				Body:   fmt.Appendf(nil, `{"status":"paid","amount_cents":%d}`, charge.AmountCents),
			},
		}, nil
	}

	m := idemmaint.New(store, &idemmaint.Config{
		Reconcile: reconcile,
		Now:       clock.Now,
		Logger:    slog.New(slog.DiscardHandler),
	})
	// A service would call m.Start(ctx) and defer m.Stop(); one pass shows
	// the sweep of the expired leases and their reconciliation.
	if err := m.RunOnce(ctx); err != nil {
		panic(err)
	}

	for _, id := range []idemstore.Identity{paid, unpaid} {
		rec, err := store.KeyGet(ctx, id)
		if err != nil {
			panic(err)
		}
		fmt.Print(id.Key, " ", rec.State)
		if rec.Response != nil {
			fmt.Printf(" %d %s", rec.Response.Status, rec.Response.Body)
		}
		fmt.Println()
	}
	s := m.Stats()
	fmt.Printf("swept %d, completed %d, released %d, unresolved %d\n", s.Swept, s.Completed, s.Released, s.Unresolved)
	// Output:
	// order-1 completed 201 {"status":"paid","amount_cents":1250}
	// order-2 released
	// swept 2, completed 1, released 1, unresolved 0
}
