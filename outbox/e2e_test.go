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
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemsqlite"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/outbox"
)

// e2e is the golden path of SPEC section 5 in miniature: a payments
// endpoint in transactional mode writes the payment and the outbox row with
// the key's completion; the relay charges a downstream bank with the
// derived key.
type e2e struct {
	app      *httptest.Server
	bank     *bank
	outbox   *outbox.SQLiteStore
	clock    *idemtest.Clock
	bankHTTP *http.Client
}

func setupE2E(t *testing.T, loseAnswers bool) *e2e {
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
	protect := idem.New(store, &idem.Config{RequireKey: true, GuardConfig: idem.GuardConfig{Transactional: true, Logger: logger}})
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
			IdempotencyKey: idem.DerivedKeyFromContext(r.Context(), "charge"),
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

	bank := newBank(t)
	bank.loseAnswers.Store(loseAnswers)
	bankHTTP := &http.Client{Transport: &http.Transport{}, Timeout: 300 * time.Millisecond}
	t.Cleanup(bankHTTP.CloseIdleConnections)
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
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, e.bank.URL+"/charges", strings.NewReader(string(m.Payload)))
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
		e.bank.URL+"/charges?idempotency_key="+url.QueryEscape(m.IdempotencyKey), nil)
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

// bank is the downstream the relay charges: an API that deduplicates
// charges by Idempotency-Key itself (a retry with a known key answers the
// charge it made) and can lose its answers after charging.
type bank struct {
	*httptest.Server
	loseAnswers atomic.Bool

	mu      sync.Mutex
	charges []charge
}

type charge struct {
	ID             int
	IdempotencyKey string
	Body           string
}

func newBank(t *testing.T) *bank {
	b := &bank{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /charges", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		key := r.Header.Get(idem.HeaderKey)
		if err != nil || key == "" {
			http.Error(w, "a charge needs a body and an Idempotency-Key", http.StatusBadRequest)
			return
		}
		c, created := b.charge(key, string(body))
		if b.loseAnswers.Load() {
			// Charged, but the answer never reaches the caller.
			conn, _, err := http.NewResponseController(w).Hijack()
			if err == nil {
				conn.Close()
			}
			return
		}
		status := http.StatusOK
		if created {
			status = http.StatusCreated
		}
		w.WriteHeader(status)
		fmt.Fprintf(w, `{"id":%d}`, c.ID)
	})
	mux.HandleFunc("GET /charges", func(w http.ResponseWriter, r *http.Request) {
		if _, ok := b.find(r.URL.Query().Get("idempotency_key")); !ok {
			http.NotFound(w, r)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	b.Server = httptest.NewServer(mux)
	t.Cleanup(b.Close)
	return b
}

func (b *bank) find(key string) (charge, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.charges {
		if c.IdempotencyKey == key {
			return c, true
		}
	}
	return charge{}, false
}

// charge makes the charge for key unless one exists.
func (b *bank) charge(key, body string) (charge, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, c := range b.charges {
		if c.IdempotencyKey == key {
			return c, false
		}
	}
	c := charge{ID: len(b.charges) + 1, IdempotencyKey: key, Body: body}
	b.charges = append(b.charges, c)
	return c, true
}

func (e *e2e) ledger() []charge {
	e.bank.mu.Lock()
	defer e.bank.mu.Unlock()
	return append([]charge(nil), e.bank.charges...)
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
			e := setupE2E(t, true)
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
			charges := e.ledger()
			if len(charges) != 1 || !strings.HasPrefix(charges[0].IdempotencyKey, "idem-") {
				t.Fatalf("bank ledger %+v, want one charge under the derived key", charges)
			}

			if !withReconcile {
				// The answer was lost: the message waits to be sent again.
				if c, _ := e.outbox.MessageCounts(ctx); c[outbox.StatePending] != 1 {
					t.Fatalf("outbox %v, want the message pending", c)
				}
				e.bank.loseAnswers.Store(false)
				e.clock.Advance(time.Second)
				if n, err := relay.RunOnce(ctx); n != 1 || err != nil {
					t.Fatalf("second RunOnce = %d, %v", n, err)
				}
			}
			if c, _ := e.outbox.MessageCounts(ctx); c[outbox.StateDone] != 1 || len(c) != 1 {
				t.Errorf("outbox %v, want the message done", c)
			}
			if again := e.ledger(); len(again) != 1 || again[0] != charges[0] {
				t.Errorf("bank ledger %+v, want still the one charge %+v", again, charges[0])
			}
		})
	}
}
