package console_test

import (
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

// keysOn returns the keys a key list page shows, in order.
func keysOn(page string) []string {
	var keys []string
	for _, m := range regexp.MustCompile(`<a class="key" href="[^"]*">([^<]*)</a>`).FindAllStringSubmatch(page, -1) {
		keys = append(keys, m[1])
	}
	return keys
}

// The key list shows the newest records first, a page at a time, filtered
// by state and endpoint.
func TestKeyListNewestFirstFilteredAndPaged(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.PageSize = 2 })
	// Created a minute apart; the keys sort the other way round by name,
	// so identity order is not creation order.
	for i, k := range []string{"e", "d", "c", "b", "a"} {
		ep := "POST /v1/payments"
		if i == 2 {
			ep = "POST /v1/refunds"
		}
		completed(t, b.store, idemstore.Identity{Endpoint: ep, Key: k}, &idemstore.Response{Status: 201})
		b.clock.Advance(time.Minute)
	}
	unknown(t, b.store, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "z"})

	var seen []string
	path := "/_idem/keys"
	for range 5 {
		page := b.get(t, path).Body.String()
		seen = append(seen, keysOn(page)...)
		next := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(page)
		if next == nil {
			break
		}
		path = strings.ReplaceAll(next[1], "&amp;", "&")
	}
	if got := strings.Join(seen, ","); got != "z,a,b,c,d,e" {
		t.Errorf("pages listed %s, want z,a,b,c,d,e (newest first)", got)
	}

	q := url.Values{"state": {"completed"}, "endpoint": {"POST /v1/payments"}}
	page := b.get(t, "/_idem/keys?"+q.Encode()+"&page=2").Body.String()
	if got := strings.Join(keysOn(page), ","); got != "d,e" {
		t.Errorf("page 2 of completed POST /v1/payments lists %s, want d,e", got)
	}
	if !strings.Contains(page, `rel="prev"`) || strings.Contains(page, `rel="next"`) {
		t.Errorf("page 2 of 2 should link back only:\n%s", page)
	}
	if !strings.Contains(page, `<option value="completed" selected>`) || !strings.Contains(page, `value="POST /v1/payments"`) {
		t.Errorf("the filter form does not show the filter in use")
	}
	page = b.get(t, "/_idem/keys?endpoint="+url.QueryEscape("POST /v1/nothing")).Body.String()
	if !strings.Contains(page, "No records match the filter.") {
		t.Errorf("an empty filter result is not said")
	}
	for _, bad := range []string{"page=0", "page=x", "state=gone"} {
		if w := b.get(t, "/_idem/keys?"+bad); w.Code != 400 {
			t.Errorf("%s: %d, want 400", bad, w.Code)
		}
	}
}

// The outbox says why each row stands where it is, and the key page tells a
// key's unknown from a payment's requires_reconciliation.
func TestExplanations(t *testing.T) {
	t.Parallel()
	b := setup(t)
	now := b.clock.Now()
	b.outbox.add(console.OutboxMessage{Topic: "charge", State: "pending", Attempts: 2, AvailableAt: now.Add(40 * time.Second), LastError: "provider answered 502"})
	b.outbox.add(console.OutboxMessage{Topic: "charge", State: "pending", Attempts: 1, AvailableAt: now.Add(-10 * time.Minute)})
	b.outbox.add(console.OutboxMessage{Topic: "charge", State: "dead", Attempts: 8, AvailableAt: now.Add(-time.Hour)})
	page := b.get(t, "/_idem/outbox?state=pending").Body.String()
	for _, want := range []string{
		"Backing off after the last attempt failed: attempt 3 is due in 40s.",
		"Due for 10m and not taken: the relay is stopped, stalled or busy",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("pending outbox lacks %q", want)
		}
	}
	if page := b.get(t, "/_idem/outbox?state=dead").Body.String(); !strings.Contains(page, "gave up after 8 attempts") {
		t.Errorf("dead letters lack their explanation")
	}

	unknown(t, b.store, testIdentity)
	page = b.get(t, "/_idem/unknown").Body.String()
	if !strings.Contains(page, "requires_reconciliation") {
		t.Errorf("the unknown queue does not tell a key's unknown from a payment's requires_reconciliation")
	}
	link := links(page, "/_idem/key?")
	if len(link) == 0 {
		t.Fatal("no key link")
	}
	if page := b.get(t, link[0]).Body.String(); !strings.Contains(page, `id="unknown-explained"`) {
		t.Errorf("the unknown key's page lacks the explanation")
	}
}

// A record whose response does not open with the console's keys (sealed
// under a key its keys file lacks) is listed like any other: the list does
// not fail for it.
func TestKeyListShowsRecordsUnderAMissingKey(t *testing.T) {
	t.Parallel()
	var store idemstore.Store
	b := setup(t, func(c *console.Config) {
		store = idemcrypt.New(c.Store, idemtest.NewTestKeyring(t, "present"))
		c.Store = store
	})
	completed(t, idemcrypt.New(b.store, idemtest.NewTestKeyring(t, "gone")), idemstore.Identity{Endpoint: "POST /v1/payments", Key: "sealed-gone"}, &idemstore.Response{Status: 201, Body: []byte("x")})
	completed(t, store, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "sealed-present"}, &idemstore.Response{Status: 201, Body: []byte("y")})
	page := b.get(t, "/_idem/keys")
	if got := strings.Join(keysOn(page.Body.String()), ","); page.Code != 200 || got != "sealed-present,sealed-gone" && got != "sealed-gone,sealed-present" {
		t.Fatalf("key list %d lists %q; want both records:\n%s", page.Code, got, page.Body)
	}
	if strings.Contains(page.Body.String(), "store is unavailable") {
		t.Fatalf("the key list reports a failure:\n%s", page.Body)
	}
}

// The key list finds a key by what it starts with, among any number of
// newer records, and keeps the search across pages and filters.
func TestKeyListSearchByKey(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.PageSize = 2; c.CountLimit = 100 })
	completed(t, b.store, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "order-1001"}, &idemstore.Response{Status: 201})
	b.clock.Advance(time.Minute)
	for i := range 250 { // more than CountLimit newer records
		completed(t, b.store, idemstore.Identity{Endpoint: "POST /v1/payments", Key: fmt.Sprintf("load-%03d", i)}, &idemstore.Response{Status: 201})
	}
	b.clock.Advance(time.Minute)
	completed(t, b.store, idemstore.Identity{Endpoint: "POST /v1/payments", Key: "order-1002"}, &idemstore.Response{Status: 201})

	page := b.get(t, "/_idem/keys?key=order-1001").Body.String()
	if got := strings.Join(keysOn(page), ","); got != "order-1001" {
		t.Errorf("key=order-1001 lists %q, want order-1001", got)
	}
	if !strings.Contains(page, `name="key" value="order-1001"`) {
		t.Errorf("the filter form does not show the key searched for")
	}
	page = b.get(t, "/_idem/keys?key=order-").Body.String()
	if got := strings.Join(keysOn(page), ","); got != "order-1002,order-1001" {
		t.Errorf("key=order- lists %q, want order-1002,order-1001 (newest first)", got)
	}
	page = b.get(t, "/_idem/keys?key=load-&state=completed").Body.String()
	next := regexp.MustCompile(`<a href="([^"]*)" rel="next">`).FindStringSubmatch(page)
	if next == nil || !strings.Contains(next[1], "key=load-") || !strings.Contains(next[1], "state=completed") {
		t.Errorf("the next page link loses the search: %v", next)
	}
	if page := b.get(t, "/_idem/keys?key=nothing-").Body.String(); !strings.Contains(page, "No records match the filter.") {
		t.Errorf("a search without a match is not said")
	}
}
