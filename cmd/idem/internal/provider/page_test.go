package provider

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
)

// GET /charges?after=SEQ&limit=N pages through the ledger in order; the
// bare GET /charges still answers the whole ledger; bad paging is 400.
func TestLedgerPages(t *testing.T) {
	t.Parallel()
	forEachStore(t, Config{}, func(t *testing.T, b *bundle) {
		for i := range 5 {
			r := b.mustPost(t, fmt.Sprintf("page-key-%d", i), fmt.Sprintf(`{"amount_cents":%d,"currency":"EUR","reference":"order-%d"}`, 100+i, i))
			if r.status != http.StatusCreated {
				t.Fatalf("POST: %d %s", r.status, r.body)
			}
			if c := r.charge(t); c.Seq <= 0 {
				t.Fatalf("charge %+v has no seq", c)
			}
		}
		all := b.ledger(t)
		if len(all) != 5 {
			t.Fatalf("whole ledger: %d charges, want 5", len(all))
		}
		var paged []Charge
		after := int64(0)
		pages := 0
		for {
			r := b.get(t, fmt.Sprintf("/charges?after=%d&limit=2", after))
			if r.status != http.StatusOK {
				t.Fatalf("page after %d: %d %s", after, r.status, r.body)
			}
			var page []Charge
			if err := json.Unmarshal(r.body, &page); err != nil || page == nil {
				t.Fatalf("page %s: %v, want a JSON array", r.body, err)
			}
			if len(page) > 2 {
				t.Fatalf("page of %d charges, limit 2", len(page))
			}
			pages++
			if len(page) == 0 {
				break
			}
			paged = append(paged, page...)
			after = page[len(page)-1].Seq
		}
		if pages != 4 || len(paged) != len(all) {
			t.Fatalf("%d pages with %d charges, want 4 pages (2+2+1+0) with %d", pages, len(paged), len(all))
		}
		for i := range all {
			if paged[i] != all[i] {
				t.Errorf("charge %d: paged %+v, whole ledger %+v", i, paged[i], all[i])
			}
			if i > 0 && all[i].Seq <= all[i-1].Seq {
				t.Errorf("seq does not grow: %d after %d", all[i].Seq, all[i-1].Seq)
			}
		}
		// after alone uses the default page size.
		if r := b.get(t, fmt.Sprintf("/charges?after=%d", all[2].Seq)); r.status != http.StatusOK {
			t.Fatalf("after alone: %d %s", r.status, r.body)
		} else {
			var page []Charge
			json.Unmarshal(r.body, &page)
			if len(page) != 2 || page[0] != all[3] {
				t.Errorf("after the third charge: %+v", page)
			}
		}
		for _, q := range []string{"after=-1", "after=x", "limit=0", "limit=1001", "limit=", "after=1&limit=two"} {
			if r := b.get(t, "/charges?"+q); r.status != http.StatusBadRequest || r.code(t) != "invalid-page" {
				t.Errorf("GET /charges?%s: %d %s, want 400 invalid-page", q, r.status, r.body)
			}
		}
	})
}
