package payments

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/provider"
)

func TestCreateReplayAndReuse(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, nil)
		const body = `{"customer_id":"cus_42","amount_cents":1999,"currency":"EUR"}`
		first := b.create(t, "order-1", body)
		if first.status != http.StatusCreated {
			t.Fatalf("status %d, want 201; body %s", first.status, first.body)
		}
		p := first.payment(t)
		if !strings.HasPrefix(p.ID, "pay_") || p.Status != StatusPending || p.CustomerID != "cus_42" ||
			p.AmountCents != 1999 || p.Currency != "EUR" || !p.CreatedAt.Equal(b.clock.Now().Truncate(time.Microsecond)) {
			t.Errorf("payment %+v", p)
		}
		if loc := first.header.Get("Location"); loc != "/v1/payments/"+p.ID {
			t.Errorf("Location %q, want /v1/payments/%s", loc, p.ID)
		}
		if first.header.Get("Idempotent-Replayed") != "" {
			t.Error("the first answer is marked replayed")
		}
		var members map[string]any
		json.Unmarshal(first.body, &members)
		for _, m := range []string{"id", "status", "customer_id", "amount_cents", "currency", "created_at"} {
			if _, ok := members[m]; !ok {
				t.Errorf("the answer lacks %q: %s", m, first.body)
			}
		}

		// The same request again, with other whitespace and key order: the
		// stored answer, replayed.
		again := b.create(t, "order-1", `{ "currency":"EUR", "amount_cents":1999, "customer_id":"cus_42" }`)
		if again.status != http.StatusCreated || again.header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("retry: status %d, replayed %q; want 201 replayed", again.status, again.header.Get("Idempotent-Replayed"))
		}
		if string(again.body) != string(first.body) || again.header.Get("Location") != first.header.Get("Location") {
			t.Errorf("retry answered %s, want %s", again.body, first.body)
		}

		// The key with another payment: 422 key-reused.
		reused := b.create(t, "order-1", `{"customer_id":"cus_42","amount_cents":2000,"currency":"EUR"}`)
		if reused.status != http.StatusUnprocessableEntity || reused.problemCode(t) != "key-reused" {
			t.Errorf("reuse: status %d, body %s; want 422 key-reused", reused.status, reused.body)
		}
		if n := b.count(t, "payments"); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
		if n := b.count(t, "idem_outbox"); n != 1 {
			t.Errorf("%d outbox rows, want 1", n)
		}
		if got := b.status(t, p.ID); got.ID != p.ID || got.Status != StatusPending {
			t.Errorf("GET: %+v", got)
		}
	})
}

func TestRetryAfterKeyExpiredFindsThePayment(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, func(c *Config) { c.KeyTTL = time.Hour })
		p := b.mustCreate(t, "late-retry", 500)
		b.clock.Advance(2 * time.Hour) // the key's record expired

		a := b.create(t, "late-retry", `{"customer_id":"cus_1","amount_cents":500,"currency":"EUR"}`)
		if a.status != http.StatusOK {
			t.Fatalf("late retry: status %d, body %s; want 200 with the existing payment", a.status, a.body)
		}
		if got := a.payment(t); got.ID != p.ID {
			t.Errorf("late retry answered payment %s, want %s", got.ID, p.ID)
		}
		if a.header.Get("Location") != "/v1/payments/"+p.ID {
			t.Errorf("Location %q", a.header.Get("Location"))
		}
		other := b.create(t, "late-retry", `{"customer_id":"cus_1","amount_cents":501,"currency":"EUR"}`)
		if other.status != http.StatusUnprocessableEntity || other.problemCode(t) != "key-reused" {
			t.Errorf("late reuse: status %d, body %s; want 422 key-reused", other.status, other.body)
		}
		if n := b.count(t, "payments"); n != 1 {
			t.Errorf("%d payments, want 1", n)
		}
		if n := b.count(t, "idem_outbox"); n != 1 {
			t.Errorf("%d outbox rows, want 1", n)
		}
	})
}

func TestTenantScoping(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, nil)
		p := b.mustCreate(t, "shared-key", 100)

		foreign := b.do(t, http.MethodGet, "/v1/payments/"+p.ID, tokenB, "", "", nil)
		if foreign.status != http.StatusNotFound || foreign.problemCode(t) != "not-found" {
			t.Errorf("another tenant's GET: status %d, body %s; want 404 not-found", foreign.status, foreign.body)
		}
		list := b.do(t, http.MethodGet, "/v1/payments", tokenB, "", "", nil)
		var page listPage
		if err := json.Unmarshal(list.body, &page); err != nil || list.status != http.StatusOK || len(page.Data) != 0 {
			t.Errorf("another tenant's list: status %d, body %s; want an empty page", list.status, list.body)
		}
		// The same key in another tenant is another payment.
		a := b.do(t, http.MethodPost, "/v1/payments", tokenB, "shared-key", "application/json",
			[]byte(`{"customer_id":"cus_1","amount_cents":100,"currency":"EUR"}`))
		if a.status != http.StatusCreated || a.header.Get("Idempotent-Replayed") != "" {
			t.Fatalf("tenant B: status %d, replayed %q; want a fresh 201", a.status, a.header.Get("Idempotent-Replayed"))
		}
		if a.payment(t).ID == p.ID {
			t.Error("tenant B got tenant A's payment")
		}
		for _, tc := range []struct{ name, token string }{{"missing", ""}, {"foreign", "not-a-token-of-anybody"}} {
			got := b.do(t, http.MethodGet, "/v1/payments/"+p.ID, tc.token, "", "", nil)
			if got.status != http.StatusUnauthorized || got.problemCode(t) != "unauthorized" {
				t.Errorf("%s token: status %d, body %s; want 401", tc.name, got.status, got.body)
			}
		}
	})
}

func TestListPagination(t *testing.T) {
	t.Parallel()
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, nil)
		var want []string
		for i := range 5 {
			p := b.mustCreate(t, "page-"+string(rune('a'+i)), 100+i)
			want = append([]string{p.ID}, want...) // newest first
		}
		b.do(t, http.MethodPost, "/v1/payments", tokenB, "other", "application/json",
			[]byte(`{"customer_id":"cus_1","amount_cents":1,"currency":"USD"}`))

		var got []string
		cursor := ""
		for pages := 0; ; pages++ {
			if pages > 5 {
				t.Fatal("pagination does not end")
			}
			path := "/v1/payments?limit=2"
			if cursor != "" {
				path += "&cursor=" + url.QueryEscape(cursor)
			}
			a := b.do(t, http.MethodGet, path, tokenA, "", "", nil)
			var page listPage
			if err := json.Unmarshal(a.body, &page); err != nil || a.status != http.StatusOK {
				t.Fatalf("list: status %d, body %s", a.status, a.body)
			}
			if len(page.Data) > 2 {
				t.Fatalf("page of %d, limit 2", len(page.Data))
			}
			for _, p := range page.Data {
				got = append(got, p.ID)
			}
			if !page.HasMore {
				if page.NextCursor != "" {
					t.Error("the last page has a cursor")
				}
				break
			}
			cursor = page.NextCursor
		}
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("listed %v, want %v", got, want)
		}
		for _, q := range []string{"limit=0", "limit=101", "limit=x", "cursor=bogus", "cursor=cDA"} {
			a := b.do(t, http.MethodGet, "/v1/payments?"+q, tokenA, "", "", nil)
			if a.status != http.StatusBadRequest || a.problemCode(t) != "invalid-query" {
				t.Errorf("?%s: status %d, body %s; want 400 invalid-query", q, a.status, a.body)
			}
		}
	})
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	const good = `{"customer_id":"cus_1","amount_cents":1999,"currency":"USD"}`
	huge := `{"customer_id":"` + strings.Repeat("x", 1<<20) + `","amount_cents":1,"currency":"USD"}`
	cases := []struct {
		name, token, key, contentType, body string
		status                              int
		code                                string
	}{
		{"malformed json", tokenA, "k", "application/json", `{"customer_id":`, 400, "malformed-json"},
		{"not json", tokenA, "k", "application/json", `hello`, 400, "malformed-json"},
		{"empty body", tokenA, "k", "application/json", ``, 400, "malformed-json"},
		{"trailing data", tokenA, "k", "application/json", good + `{}`, 400, "malformed-json"},
		{"duplicate member", tokenA, "k", "application/json", `{"customer_id":"a","customer_id":"b","amount_cents":1,"currency":"USD"}`, 400, "malformed-json"},
		{"array", tokenA, "k", "application/json", `[1,2]`, 422, "validation-failed"},
		{"amount as string", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":"1999","currency":"USD"}`, 422, "validation-failed"},
		{"customer as number", tokenA, "k", "application/json", `{"customer_id":7,"amount_cents":1999,"currency":"USD"}`, 422, "validation-failed"},
		{"null amount", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":null,"currency":"USD"}`, 422, "validation-failed"},
		{"negative amount", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":-5,"currency":"USD"}`, 422, "validation-failed"},
		{"zero amount", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":0,"currency":"USD"}`, 422, "validation-failed"},
		{"amount over the maximum", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":100000001,"currency":"USD"}`, 422, "validation-failed"},
		{"amount over int64", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":99999999999999999999999999,"currency":"USD"}`, 422, "validation-failed"},
		{"fractional amount", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":19.99,"currency":"USD"}`, 422, "validation-failed"},
		{"exponent amount", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":1e3,"currency":"USD"}`, 422, "validation-failed"},
		{"unknown currency", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":1999,"currency":"XXX"}`, 422, "validation-failed"},
		{"lower-case currency", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":1999,"currency":"usd"}`, 422, "validation-failed"},
		{"long customer", tokenA, "k", "application/json", `{"customer_id":"` + strings.Repeat("c", 256) + `","amount_cents":1,"currency":"USD"}`, 422, "validation-failed"},
		{"customer with spaces", tokenA, "k", "application/json", `{"customer_id":"a b","amount_cents":1,"currency":"USD"}`, 422, "validation-failed"},
		{"1 MiB string", tokenA, "k", "application/json", huge, 413, "body-too-large"},
		{"unknown member", tokenA, "k", "application/json", `{"customer_id":"cus_1","amount_cents":1999,"currency":"USD","capture":true}`, 422, "validation-failed"},
		{"missing members", tokenA, "k", "application/json", `{}`, 422, "validation-failed"},
		{"form content type", tokenA, "k", "application/x-www-form-urlencoded", good, 415, "unsupported-media-type"},
		{"missing token", "", "k", "application/json", good, 401, "unauthorized"},
		{"foreign token", "token-of-nobody-at-all", "k", "application/json", good, 401, "unauthorized"},
		{"missing key", tokenA, "", "application/json", good, 400, "key-missing"},
	}
	stores(t, func(t *testing.T, store string) {
		b := setup(t, store, provider.Faults{}, nil)
		for i, tc := range cases {
			key := ""
			if tc.key != "" {
				key = "bad-input-" + string(rune('A'+i))
			}
			a := b.do(t, http.MethodPost, "/v1/payments", tc.token, key, tc.contentType, []byte(tc.body))
			if a.status != tc.status {
				t.Errorf("%s: status %d, want %d; body %.300s", tc.name, a.status, tc.status, a.body)
				continue
			}
			if code := a.problemCode(t); code != tc.code {
				t.Errorf("%s: code %q, want %q", tc.name, code, tc.code)
			}
			if strings.Contains(string(a.body), "xxxxxxxx") || strings.Contains(string(a.body), "a b") {
				t.Errorf("%s: the problem echoes the body: %.300s", tc.name, a.body)
			}
			for _, table := range []string{"payments", "idem_outbox", "idem_keys"} {
				if n := b.count(t, table); n != 0 {
					t.Fatalf("%s: %d rows in %s, want 0", tc.name, n, table)
				}
			}
			// The corrected request with the same key succeeds.
			if key == "" {
				key = "bad-input-" + string(rune('A'+i))
			}
			fixed := b.do(t, http.MethodPost, "/v1/payments", tokenA, key, "application/json", []byte(good))
			if fixed.status != http.StatusCreated || fixed.header.Get("Idempotent-Replayed") != "" {
				t.Fatalf("%s: the corrected request got %d (replayed %q), want a fresh 201; body %s",
					tc.name, fixed.status, fixed.header.Get("Idempotent-Replayed"), fixed.body)
			}
			// Clean up for the next case's counts.
			b.truncate(t)
		}
	})
}

func TestValidationNamesEveryProblem(t *testing.T) {
	t.Parallel()
	b := setup(t, "sqlite:"+t.TempDir()+"/p.db", provider.Faults{}, nil)
	a := b.create(t, "k", `{"customer_id":"","amount_cents":-1,"currency":"usd","extra":1,"`+strings.Repeat("n", 100)+`":2}`)
	var p struct {
		InvalidParams []invalidParam `json:"invalid-params"`
	}
	if err := json.Unmarshal(a.body, &p); err != nil || a.status != http.StatusUnprocessableEntity {
		t.Fatalf("status %d, body %s", a.status, a.body)
	}
	var names []string
	for _, ip := range p.InvalidParams {
		names = append(names, ip.Name)
		if ip.Reason == "" {
			t.Errorf("%s has no reason", ip.Name)
		}
	}
	want := "customer_id,amount_cents,currency,extra,(unsupported member)"
	if strings.Join(names, ",") != want {
		t.Errorf("invalid-params names %v, want %s", names, want)
	}
}
