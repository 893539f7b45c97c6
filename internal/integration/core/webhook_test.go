package idem_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/internal/integration/teststore"
	"github.com/idem-dev/idem/internal/testenv"
)

// providerEvent is a payment provider's webhook event. The provider sends
// an event again until it gets a 2xx (and sometimes twice at once), with
// the same id and a new delivery_attempt.
type providerEvent struct {
	ID              string `json:"id"`
	Type            string `json:"type"`
	Account         string `json:"account"`
	AmountCents     int    `json:"amount_cents"`
	DeliveryAttempt int    `json:"delivery_attempt"`
}

// webhookReceiver credits an account once per provider event, however often
// the event is delivered: the event id is the key, the event (without its
// delivery_attempt) the fingerprint.
type webhookReceiver struct {
	guard   *idem.Guard
	mu      sync.Mutex
	credits map[string]int // account -> cents
	entries int
}

func (wr *webhookReceiver) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var ev providerEvent
	if err := json.NewDecoder(r.Body).Decode(&ev); err != nil || ev.ID == "" {
		http.Error(w, "bad event", http.StatusBadRequest)
		return
	}
	entry, err := idem.Do(r.Context(), wr.guard, ev.ID, "webhook "+ev.Type, ev,
		func(ctx context.Context) (string, error) {
			wr.mu.Lock()
			defer wr.mu.Unlock()
			wr.credits[ev.Account] += ev.AmountCents
			wr.entries++
			return fmt.Sprintf("entry_%d", wr.entries), nil
		},
		idem.WithScope("provider-x"),
		idem.WithFingerprint(idem.FingerprintConfig{Exclude: []string{"delivery_attempt"}}))
	var ie *idem.Error
	switch {
	case err == nil:
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"entry":%q}`, entry)
	case errors.Is(err, idem.ErrKeyReused):
		// The provider sent another event under a used id: a bug on its
		// side that retrying cannot fix.
		http.Error(w, "event id reused", http.StatusUnprocessableEntity)
	case errors.As(err, &ie) && ie.RetryAfter > 0:
		// In progress elsewhere, or the store is down: have it come again.
		w.Header().Set("Retry-After", strconv.Itoa(int(ie.RetryAfter/time.Second)))
		http.Error(w, "try again", http.StatusServiceUnavailable)
	default:
		http.Error(w, "failed", http.StatusInternalServerError)
	}
}

func deliver(t *testing.T, url string, ev providerEvent) (int, string) {
	t.Helper()
	b, _ := json.Marshal(ev)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Error(err)
		return 0, ""
	}
	defer resp.Body.Close()
	var out struct{ Entry string }
	json.NewDecoder(resp.Body).Decode(&out)
	return resp.StatusCode, out.Entry
}

// TestDoWebhookReceiver: a provider delivers three events, each 20 times
// at once and then again later; the receiver, on SQLite, credits each
// exactly once and answers every delivery that found the event done with
// its ledger entry.
func TestDoWebhookReceiver(t *testing.T) {
	t.Parallel()
	clock := newTestClock()
	store := teststore.OpenSQLite(t, filepath.Join(t.TempDir(), "idem.db"), clock.Now)
	wr := &webhookReceiver{guard: testGuard(store, clock, idem.GuardConfig{Wait: 10 * time.Second}), credits: map[string]int{}}
	srv := httptest.NewServer(wr)
	defer srv.Close()

	events := []providerEvent{
		{ID: "evt_1", Type: "payment.succeeded", Account: "acct_a", AmountCents: 500},
		{ID: "evt_2", Type: "payment.succeeded", Account: "acct_a", AmountCents: 250},
		{ID: "evt_3", Type: "payment.succeeded", Account: "acct_b", AmountCents: 900},
	}
	entries := make([]map[string]int, len(events))
	var mu sync.Mutex
	testenv.Race(len(events)*20, func(i int) {
		ev := events[i%len(events)]
		ev.DeliveryAttempt = 1 + i/len(events)
		code, entry := deliver(t, srv.URL, ev)
		if code != http.StatusOK {
			t.Errorf("delivery %d of %s: %d", ev.DeliveryAttempt, ev.ID, code)
		}
		mu.Lock()
		if entries[i%len(events)] == nil {
			entries[i%len(events)] = map[string]int{}
		}
		entries[i%len(events)][entry]++
		mu.Unlock()
	})
	for i, e := range entries {
		if len(e) != 1 {
			t.Errorf("event %s was answered with the entries %v, want one", events[i].ID, e)
		}
	}
	clock.Advance(time.Hour) // the provider's back-off
	for _, ev := range events {
		ev.DeliveryAttempt = 21
		if code, _ := deliver(t, srv.URL, ev); code != http.StatusOK {
			t.Errorf("late redelivery of %s: %d", ev.ID, code)
		}
	}
	bad := events[0]
	bad.AmountCents = 5000
	if code, _ := deliver(t, srv.URL, bad); code != http.StatusUnprocessableEntity {
		t.Errorf("another event under a used id: %d, want 422", code)
	}

	wr.mu.Lock()
	defer wr.mu.Unlock()
	if wr.entries != 3 || wr.credits["acct_a"] != 750 || wr.credits["acct_b"] != 900 {
		t.Fatalf("%d ledger entries, credits %v; want 3 entries, acct_a 750 and acct_b 900", wr.entries, wr.credits)
	}
}
