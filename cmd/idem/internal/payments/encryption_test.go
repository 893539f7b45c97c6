package payments

import (
	"net/http"
	"strings"
	"testing"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// With Config.Keyring the payment answers are stored sealed (transactional
// completions included) and replay; Store(), for the console, opens them.
func TestKeyringSealsStoredAnswers(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		kr := idemtest.NewTestKeyring(t, "pay-1")
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.Keyring = kr })
		const body = `{"customer_id":"cus_SECRET","amount_cents":1999,"currency":"EUR"}`
		first := b.create(t, "order-1", body)
		again := b.create(t, "order-1", body)
		if first.status != http.StatusCreated || again.status != http.StatusCreated ||
			again.header.Get("Idempotent-Replayed") != "true" || string(again.body) != string(first.body) {
			t.Fatalf("first %d %s, retry %d %s", first.status, first.body, again.status, again.body)
		}
		raw, err := b.svc.db.store.KeyList(b.ctx, &idemstore.ListParams{})
		if err != nil || len(raw) != 1 {
			t.Fatalf("KeyList = %d, %v", len(raw), err)
		}
		if name, ok := idemcrypt.SealedBy(raw[0].Response); !ok || name != "pay-1" || strings.Contains(string(raw[0].Response.Body), "cus_SECRET") {
			t.Fatalf("stored answer not sealed by pay-1: %+v", raw[0].Response)
		}
		opened, err := b.svc.Store().KeyGet(b.ctx, raw[0].Identity)
		if err != nil || string(opened.Response.Body) != string(first.body) {
			t.Fatalf("Store().KeyGet = %v, %v", opened, err)
		}
	})
}
