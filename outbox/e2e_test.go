package outbox_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/provider"
	"github.com/idem-dev/idem/outbox"
)

// e2e is the golden path of SPEC section 5 in miniature: a payments
// endpoint in transactional mode writes the payment and the outbox row with
// the key's completion; the relay charges the simulated provider with the
// derived key.
type e2e struct {
	app      *httptest.Server
	bank     *provider.Server
	outbox   *outbox.SQLiteStore
	clock    *idemtest.Clock
	bankHTTP *http.Client
}

func setupE2E(t *testing.T, faults provider.Faults) *e2e {
	t.Helper()
	dir := t.TempDir()
	logger := slog.New(slog.NewTextHandler(t.Output(), nil))
	store, err := idemsqlite.Open(filepath.Join(dir, "app.db"), nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { store.Close() })
	ctx := context.Background()
	clock := idemtest.NewClock(time.Now())
	ob := outbox.NewSQLite(store.DB(), &outbox.Config{Now: clock.Now})
	if _, err := ob.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := store.DB().ExecContext(ctx, `CREATE TABLE payments (id INTEGER PRIMARY KEY, amount_cents INTEGER NOT NULL)`); err != nil {
		t.Fatal(err)
	}

	mux := http.NewServeMux()
	protect := idem.New(store, &idem.Config{RequireKey: true, Transactional: true, Logger: logger})
	mux.Handle("POST /payments", protect(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tx, err := idemsqlite.TxFromContext(r.Context())
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		res, err := tx.ExecContext(r.Context(), `INSERT INTO payments (amount_cents) VALUES (1250)`)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		id, _ := res.LastInsertId()
		_, err = ob.Enqueue(r.Context(), tx, outbox.Message{
			Topic:          "provider.charge",
			Payload:        json.RawMessage(fmt.Sprintf(`{"amount_cents":1250,"currency":"EUR","reference":"payment-%d"}`, id)),
			IdempotencyKey: idem.DerivedKey(r.Context(), "charge"),
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusCreated)
		fmt.Fprintf(w, `{"id":%d}`, id)
	})))
	app := httptest.NewServer(mux)
	t.Cleanup(app.Close)

	bank, err := provider.Listen("127.0.0.1:0", &provider.Config{
		Store:  "sqlite:" + filepath.Join(dir, "bank.db"),
		Faults: faults,
		Logger: logger,
	})
	if err != nil {
		t.Fatal(err)
	}
	bankHTTP := &http.Client{Transport: &http.Transport{}, Timeout: 300 * time.Millisecond}
	t.Cleanup(func() {
		bankHTTP.CloseIdleConnections()
		bank.Close()
	})
	return &e2e{app: app, bank: bank, outbox: ob, clock: clock, bankHTTP: bankHTTP}
}

// pay sends the client's POST /payments and returns the status and whether
// it was replayed.
func (e *e2e) pay(t *testing.T, key string) (int, bool) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.app.URL+"/payments", strings.NewReader(`{"amount_cents":1250}`))
	req.Header.Set("Idempotency-Key", key)
	resp, err := e.app.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get(idem.HeaderReplayed) == "true"
}

// deliver charges the bank with the message's key.
func (e *e2e) deliver(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.bank.URL()+"/charges", strings.NewReader(string(m.Payload)))
	if err != nil {
		return outbox.OutcomePermanent, err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(idem.HeaderKey, m.IdempotencyKey)
	return outbox.HTTPOutcome(e.bankHTTP.Do(req))
}

// reconcile asks the bank whether the charge with the message's key exists.
func (e *e2e) reconcile(ctx context.Context, m outbox.Message) (outbox.Outcome, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet,
		e.bank.URL()+"/charges?idempotency_key="+url.QueryEscape(m.IdempotencyKey), nil)
	if err != nil {
		return outbox.OutcomeUnknown, err
	}
	resp, err := e.bankHTTP.Do(req)
	if err != nil {
		return outbox.OutcomeUnknown, err
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
		return outbox.OutcomeDelivered, nil
	case http.StatusNotFound:
		return outbox.OutcomeRetry, nil
	}
	return outbox.OutcomeUnknown, fmt.Errorf("bank answered %s", resp.Status)
}

func (e *e2e) charges(t *testing.T) []provider.Charge {
	t.Helper()
	cs, err := e.bank.Charges(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestEndToEndLostAnswer: the bank charges but its answer is lost. With an
// OnUnknown hook the relay learns of the charge by asking; without one it
// sends again with the same derived key and the bank replays. Either way the
// customer is charged once.
func TestEndToEndLostAnswer(t *testing.T) {
	t.Parallel()
	for _, withReconcile := range []bool{true, false} {
		t.Run(fmt.Sprint("reconcile=", withReconcile), func(t *testing.T) {
			t.Parallel()
			e := setupE2E(t, provider.Faults{TimeoutRate: 1})
			if status, _ := e.pay(t, "client-key-1"); status != http.StatusCreated {
				t.Fatalf("POST /payments: %d", status)
			}
			if status, replayed := e.pay(t, "client-key-1"); status != http.StatusCreated || !replayed {
				t.Fatalf("retried POST /payments: %d, replayed %v", status, replayed)
			}
			if c, err := e.outbox.MessageCounts(context.Background()); err != nil || c[outbox.StatePending] != 1 {
				t.Fatalf("outbox %v, %v: want one pending message", c, err)
			}

			cfg := &outbox.RelayConfig{
				Deliver: e.deliver,
				Now:     e.clock.Now,
				Backoff: outbox.Backoff{Base: time.Second},
				Logger:  slog.New(slog.NewTextHandler(t.Output(), nil)),
			}
			if withReconcile {
				cfg.OnUnknown = e.reconcile
			}
			relay := outbox.NewRelay(e.outbox, cfg)
			ctx := context.Background()
			if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
				t.Fatalf("RunOnce = %d, %v", n, err)
			}
			charges := e.charges(t)
			if len(charges) != 1 || !strings.HasPrefix(charges[0].IdempotencyKey, "idem-") {
				t.Fatalf("bank ledger %+v, want one charge under the derived key", charges)
			}

			if !withReconcile {
				// The answer was lost: the message waits to be sent again.
				if c, _ := e.outbox.MessageCounts(ctx); c[outbox.StatePending] != 1 {
					t.Fatalf("outbox %v, want the message pending", c)
				}
				if err := e.bank.SetFaults(provider.Faults{}); err != nil {
					t.Fatal(err)
				}
				e.clock.Advance(time.Second)
				if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
					t.Fatalf("second RunOnce = %d, %v", n, err)
				}
			}
			if c, _ := e.outbox.MessageCounts(ctx); c[outbox.StateDone] != 1 || len(c) != 1 {
				t.Errorf("outbox %v, want the message done", c)
			}
			if again := e.charges(t); len(again) != 1 || again[0] != charges[0] {
				t.Errorf("bank ledger %+v, want still the one charge %+v", again, charges[0])
			}
		})
	}
}
