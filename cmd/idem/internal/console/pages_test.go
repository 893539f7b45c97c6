package console_test

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	"github.com/idem-dev/idem/idemstore"
)

// openKey opens the key page of the first record on the unknown queue.
func openKey(t *testing.T, b *bundle) string {
	t.Helper()
	keys := links(b.get(t, "/_idem/unknown").Body.String(), "/_idem/key?")
	if len(keys) == 0 {
		t.Fatal("the unknown queue links to no key")
	}
	rec := b.get(t, keys[0])
	if rec.Code != http.StatusOK {
		t.Fatalf("key page: %d", rec.Code)
	}
	return rec.Body.String()
}

func TestResolveToCompleted(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	for _, want := range []string{testIdentity.Key, "POST /v1/payments", "tenant-a", "fp-" + testIdentity.Key, `id="state">unknown<`, "Resolve as completed", "Release the key"} {
		if !strings.Contains(page, want) {
			t.Errorf("the key page lacks %q", want)
		}
	}

	rec := b.post(t, "/_idem/key/resolve", url.Values{
		"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")}, "to": {"completed"},
		"status": {"201"}, "content_type": {"application/json"}, "body": {`{"id":"pay_1"}`},
	})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("resolve: %d\n%s", rec.Code, rec.Body)
	}
	got := getRecord(t, b.store, testIdentity)
	if got.State != idemstore.StateCompleted || got.Response == nil || got.Response.Status != 201 ||
		string(got.Response.Body) != `{"id":"pay_1"}` || got.Response.Header.Get("Content-Type") != "application/json" {
		t.Fatalf("record after resolve: %s %+v", got.State, got.Response)
	}

	// The redirect shows the new state and says what happened.
	after := b.get(t, rec.Header().Get("Location")).Body.String()
	if !strings.Contains(after, `id="state">completed<`) || !strings.Contains(after, "Resolved: the record is completed") ||
		strings.Contains(after, "Resolve as completed") {
		t.Errorf("the page after resolving does not show the completed record:\n%s", after)
	}

	// The audit line names the record by hash only.
	logs := b.logs.String()
	for _, want := range []string{"operator resolved an unknown key", "action=resolve", "key_hash=", "from=unknown", "to=completed", "status=201", "operator=bearer"} {
		if !strings.Contains(logs, want) {
			t.Errorf("audit log lacks %q:\n%s", want, logs)
		}
	}
	if strings.Contains(logs, testIdentity.Key) {
		t.Errorf("the raw key reached the log:\n%s", logs)
	}
}

func TestResolveToReleased(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	rec := b.post(t, "/_idem/key/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")}, "to": {"released"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("resolve: %d", rec.Code)
	}
	if got := getRecord(t, b.store, testIdentity); got.State != idemstore.StateReleased {
		t.Fatalf("state %s, want released", got.State)
	}
	if !strings.Contains(b.logs.String(), "to=released") {
		t.Error("no audit line")
	}
}

func TestResolveNotReplayable(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	rec := b.post(t, "/_idem/key/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")},
		"to": {"completed"}, "status": {"200"}, "not_replayable": {"1"}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("resolve: %d", rec.Code)
	}
	if got := getRecord(t, b.store, testIdentity); got.State != idemstore.StateCompleted || !got.NotReplayable {
		t.Fatalf("record %s not replayable=%v, want completed and not replayable", got.State, got.NotReplayable)
	}
}

func TestResolveRejectsBadInput(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	csrf, ref := formValue(t, page, "csrf"), formValue(t, page, "ref")
	for _, form := range []url.Values{
		{"to": {"in_progress"}, "ref": {ref}},
		{"to": {"completed"}, "ref": {ref}, "status": {"99"}},
		{"to": {"completed"}, "ref": {ref}, "status": {"abc"}},
		{"to": {"completed"}, "ref": {ref}, "status": {"200"}, "content_type": {"text/plain\r\nSet-Cookie: x=y"}, "body": {"x"}},
		{"to": {"released"}, "ref": {"garbage"}},
		{"to": {"released"}, "ref": {ref[:len(ref)-4] + "AAAA"}},
	} {
		form.Set("csrf", csrf)
		if rec := b.post(t, "/_idem/key/resolve", form); rec.Code != http.StatusBadRequest {
			t.Errorf("resolve %v: %d, want 400", form, rec.Code)
		}
	}
	if got := getRecord(t, b.store, testIdentity); got.State != idemstore.StateUnknown {
		t.Fatalf("state %s, want unknown", got.State)
	}
	// A key link (a ref without the record's token) cannot resolve.
	keyRef, _ := url.ParseQuery(strings.SplitN(links(b.get(t, "/_idem/unknown").Body.String(), "/_idem/key?")[0], "?", 2)[1])
	if rec := b.post(t, "/_idem/key/resolve", url.Values{"csrf": {csrf}, "ref": {keyRef.Get("ref")}, "to": {"released"}}); rec.Code != http.StatusBadRequest {
		t.Errorf("resolve with a link's ref: %d, want 400", rec.Code)
	}
}

// TestResolveIsFenced acts on a stale page: the record changed after the
// operator loaded it, and the resolution must write nothing.
func TestResolveIsFenced(t *testing.T) {
	t.Parallel()
	t.Run("resolved meanwhile", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unknown(t, b.store, testIdentity)
		page := openKey(t, b)
		// The reconciler resolves it first.
		rec := getRecord(t, b.store, testIdentity)
		if err := b.store.KeyResolve(context.Background(), &idemstore.ResolveParams{Identity: testIdentity, Token: rec.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
		resp := b.post(t, "/_idem/key/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")},
			"to": {"completed"}, "status": {"200"}, "body": {"{}"}})
		if resp.Code != http.StatusConflict || !strings.Contains(resp.Body.String(), "Nothing was written") {
			t.Fatalf("stale resolve: %d, want 409", resp.Code)
		}
		if got := getRecord(t, b.store, testIdentity); got.State != idemstore.StateReleased {
			t.Fatalf("state %s, want the reconciler's released", got.State)
		}
	})
	t.Run("taken over and unknown again", func(t *testing.T) {
		t.Parallel()
		b := setup(t)
		unknown(t, b.store, testIdentity)
		page := openKey(t, b)
		// Meanwhile it is released, retried by the client, and that attempt's
		// outcome is unknown too: same state, another attempt.
		rec := getRecord(t, b.store, testIdentity)
		if err := b.store.KeyResolve(context.Background(), &idemstore.ResolveParams{Identity: testIdentity, Token: rec.Token, To: idemstore.StateReleased}); err != nil {
			t.Fatal(err)
		}
		unknown(t, b.store, testIdentity)
		resp := b.post(t, "/_idem/key/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")}, "to": {"released"}})
		if resp.Code != http.StatusConflict {
			t.Fatalf("stale resolve: %d, want 409", resp.Code)
		}
		if got := getRecord(t, b.store, testIdentity); got.State != idemstore.StateUnknown || got.Attempts != 2 {
			t.Fatalf("record %s after %d attempts, want the second attempt still unknown", got.State, got.Attempts)
		}
		if !strings.Contains(b.logs.String(), "resolution refused") {
			t.Error("the refused resolution is not logged")
		}
	})
}

func TestEscaping(t *testing.T) {
	t.Parallel()
	b := setup(t)
	id := idemstore.Identity{Scope: `<i>tenant</i>`, Endpoint: "POST /v1/payments", Key: `"><script>alert('key')</script>`}
	completed(t, b.store, id, &idemstore.Response{
		Status: 200,
		Header: http.Header{"Content-Type": {`text/html"><script>alert('ct')</script>`}},
		Body:   []byte(`<script>alert("body")</script><img src=x onerror=alert(1)>`),
	})
	list := b.get(t, "/_idem/keys").Body.String()
	keys := links(list, "/_idem/key?")
	if len(keys) != 1 {
		t.Fatalf("%d key links, want 1", len(keys))
	}
	page := b.get(t, keys[0]).Body.String()
	for name, p := range map[string]string{"list": list, "key page": page} {
		if strings.Contains(p, "<script>") || strings.Contains(p, "<img") || strings.Contains(p, "<i>tenant") {
			t.Errorf("%s renders markup from the record unescaped:\n%s", name, p)
		}
	}
	for _, want := range []string{`&lt;script&gt;alert(&#34;body&#34;)&lt;/script&gt;`, `&lt;i&gt;tenant&lt;/i&gt;`, `&lt;script&gt;alert(&#39;key&#39;)&lt;/script&gt;`} {
		if !strings.Contains(page, want) {
			t.Errorf("the key page lacks the escaped %s", want)
		}
	}
}

func TestKeysStayOutOfURLs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	for _, path := range []string{"/_idem/unknown", "/_idem/keys"} {
		page := b.get(t, path).Body.String()
		if !strings.Contains(page, testIdentity.Key) {
			t.Fatalf("%s does not show the key", path)
		}
		for _, l := range links(page, "") {
			if strings.Contains(l, testIdentity.Key) || strings.Contains(l, "tenant-a") {
				t.Errorf("link %q carries the key or scope", l)
			}
		}
	}
	// A link from another console (another token) opens nothing.
	other := setup(t, func(c *console.Config) { c.Token = "another-token-0123456789abcdef"; c.Store = b.store })
	link := links(b.get(t, "/_idem/unknown").Body.String(), "/_idem/key?")[0]
	if rec := other.get(t, link); rec.Code != http.StatusNotFound {
		t.Errorf("another console's link: %d, want 404", rec.Code)
	}
}

func TestKeyPage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body := strings.Repeat("é", 3000) // 6000 bytes: cut, and not mid-character
	completed(t, b.store, testIdentity, &idemstore.Response{Status: 201, Header: http.Header{"Location": {"/v1/payments/1"}}, Body: []byte(body)})
	page := b.get(t, links(b.get(t, "/_idem/keys").Body.String(), "/_idem/key?")[0]).Body.String()
	for _, want := range []string{`id="resp-status">201<`, "/v1/payments/1", "6000 bytes, first 4096 shown", "created: the first attempt", "retention ends", `id="state">completed<`} {
		if !strings.Contains(page, want) {
			t.Errorf("the key page lacks %q", want)
		}
	}
	if strings.Contains(page, "Resolve as completed") {
		t.Error("a completed record offers the resolve action")
	}

	bin := idemstore.Identity{Endpoint: "POST /v1/files", Key: "bin"}
	completed(t, b.store, bin, &idemstore.Response{Status: 200, Body: []byte{0x89, 'P', 'N', 'G', 0, 1, 2, 0xff}})
	for _, l := range links(b.get(t, "/_idem/keys").Body.String(), "/_idem/key?") {
		if p := b.get(t, l).Body.String(); strings.Contains(p, "POST /v1/files") && !strings.Contains(p, "binary (hex)") {
			t.Error("a binary body is not shown as hex")
		}
	}

	// A record that is gone: 404 with a way back.
	link := links(b.get(t, "/_idem/keys").Body.String(), "/_idem/key?")[0]
	b.clock.Advance(25 * time.Hour)
	if rec := b.get(t, link); rec.Code != http.StatusNotFound {
		t.Errorf("an expired record: %d, want 404", rec.Code)
	}
}

func TestOverview(t *testing.T) {
	t.Parallel()
	totals := map[string]float64{"created": 10, "replayed": 4, "unknown": 1}
	b := setup(t, func(c *console.Config) {
		c.CountLimit = 3
		c.Decisions = func() map[string]float64 { return totals }
		c.Stats = func(context.Context) []console.Stat {
			return []console.Stat{{Name: "Unknown backlog", Value: "2", Warn: true}}
		}
	})
	for i := range 2 {
		unknown(t, b.store, idemstore.Identity{Endpoint: "POST /x", Key: fmt.Sprintf("u%d", i)})
	}
	for i := range 5 {
		completed(t, b.store, idemstore.Identity{Endpoint: "POST /x", Key: fmt.Sprintf("c%d", i)}, &idemstore.Response{Status: 200})
	}
	reserve(t, b.store, idemstore.Identity{Endpoint: "POST /x", Key: "p"})
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "a", State: "pending"})
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "b", State: "dead"})

	page := b.get(t, "/_idem/").Body.String()
	for _, want := range []string{
		`id="count-unknown">2<`, `id="count-completed">3&#43;<`, `id="count-in_progress">1<`, `id="count-released">0<`,
		"Unknown backlog", "Rates appear when two views",
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the overview lacks %q:\n%s", want, page)
		}
	}
	// A minute later, the rates are the difference over that minute.
	b.clock.Advance(time.Minute)
	totals = map[string]float64{"created": 70, "replayed": 4, "unknown": 1}
	page = b.get(t, "/_idem/").Body.String()
	if !strings.Contains(page, `<td>created</td><td class="num">70</td><td class="num">60.0</td>`) || !strings.Contains(page, "rates over the last 1m") {
		t.Errorf("the overview does not show created at 60.0/min:\n%s", page)
	}
}

func TestOverviewWithTheStoreDown(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Store = downStore{} })
	b.outbox.err = fmt.Errorf("connection refused")
	rec := b.get(t, "/_idem/")
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "store unavailable") || !strings.Contains(rec.Body.String(), "The outbox could not be read") {
		t.Fatalf("overview with the store down: %d\n%s", rec.Code, rec.Body)
	}
	if rec := b.get(t, "/_idem/unknown"); !strings.Contains(rec.Body.String(), "The store is unavailable") {
		t.Fatalf("unknown queue with the store down:\n%s", rec.Body)
	}
}

func TestUnknownQueuePages(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.PageSize = 2 })
	for i := range 5 {
		unknown(t, b.store, idemstore.Identity{Endpoint: "POST /x", Key: fmt.Sprintf("u%d", i)})
	}
	completed(t, b.store, idemstore.Identity{Endpoint: "POST /x", Key: "c"}, &idemstore.Response{Status: 200})
	var seen []string
	path := "/_idem/unknown"
	for range 10 {
		page := b.get(t, path).Body.String()
		for i := range 6 {
			if strings.Contains(page, fmt.Sprintf(">u%d<", i)) {
				seen = append(seen, fmt.Sprintf("u%d", i))
			}
		}
		if strings.Contains(page, ">c<") {
			t.Fatal("the unknown queue lists a completed record")
		}
		next := links(page, "/_idem/unknown?")
		if len(next) == 0 {
			break
		}
		path = next[0]
	}
	if strings.Join(seen, ",") != "u0,u1,u2,u3,u4" {
		t.Fatalf("pages listed %v, want u0..u4 once each", seen)
	}
	if rec := b.get(t, "/_idem/keys?state=bogus"); rec.Code != http.StatusBadRequest {
		t.Errorf("a bogus state filter: %d, want 400", rec.Code)
	}
}

func TestOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "pay-1", State: "pending", Payload: []byte(`{"amount":1}`)})
	b.outbox.add(console.OutboxMessage{Topic: "charge", IdempotencyKey: "pay-2", State: "dead", Attempts: 8,
		LastError: `<script>alert("provider")</script> 502`, Payload: []byte(`{"amount":2}`)})

	pending := b.get(t, "/_idem/outbox").Body.String()
	if !strings.Contains(pending, "pay-1") || strings.Contains(pending, "pay-2") || strings.Contains(pending, ">Retry<") {
		t.Errorf("the pending page is wrong:\n%s", pending)
	}
	dead := b.get(t, "/_idem/outbox?state=dead").Body.String()
	if !strings.Contains(dead, "pay-2") || !strings.Contains(dead, ">Retry<") || strings.Contains(dead, "<script>") ||
		!strings.Contains(dead, "&lt;script&gt;") {
		t.Errorf("the dead-letter page is wrong:\n%s", dead)
	}

	rec := b.post(t, "/_idem/outbox/retry", url.Values{"csrf": {formValue(t, dead, "csrf")}, "id": {formValue(t, dead, "id")}})
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("retry: %d\n%s", rec.Code, rec.Body)
	}
	if b.outbox.state(2) != "pending" {
		t.Fatalf("message state %s, want pending", b.outbox.state(2))
	}
	if after := b.get(t, rec.Header().Get("Location")).Body.String(); !strings.Contains(after, "pending again") || strings.Contains(after, "pay-2") {
		t.Errorf("the page after the retry is wrong:\n%s", after)
	}
	if logs := b.logs.String(); !strings.Contains(logs, "action=outbox_retry") || !strings.Contains(logs, "message_id=2") {
		t.Errorf("no audit line for the retry:\n%s", logs)
	}
	// Retrying it again: it is not dead any more.
	if rec := b.post(t, "/_idem/outbox/retry", url.Values{"csrf": {b.csrf(t)}, "id": {"2"}}); rec.Code != http.StatusConflict {
		t.Errorf("second retry: %d, want 409", rec.Code)
	}
	if rec := b.post(t, "/_idem/outbox/retry", url.Values{"csrf": {b.csrf(t)}, "id": {"x"}}); rec.Code != http.StatusBadRequest {
		t.Errorf("retry of a bad id: %d, want 400", rec.Code)
	}
}

func TestWithoutOutbox(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Outbox = nil })
	if page := b.get(t, "/_idem/outbox").Body.String(); !strings.Contains(page, "No outbox is connected") {
		t.Error("the outbox page does not say there is no outbox")
	}
	if rec := b.post(t, "/_idem/outbox/retry", url.Values{"csrf": {b.csrf(t)}, "id": {"1"}}); rec.Code != http.StatusNotFound {
		t.Errorf("retry without an outbox: %d, want 404", rec.Code)
	}
}

func TestPrefix(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *console.Config) { c.Prefix = "/ops/idem/" })
	if rec := b.get(t, "/ops/idem/"); rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `href="/ops/idem/unknown"`) {
		t.Fatalf("GET /ops/idem/: %d", rec.Code)
	}
	if rec := b.do(httptestGet("/ops/idem/keys")); rec.Code != http.StatusUnauthorized {
		t.Fatalf("unauthenticated: %d, want 401", rec.Code)
	}
}

// downStore is a store that is unreachable.
type downStore struct{ idemstore.Store }

func (downStore) KeyList(context.Context, *idemstore.ListParams) ([]*idemstore.Record, error) {
	return nil, fmt.Errorf("dial tcp: connection refused")
}

func TestKeyHashJoinsTheOtherLogs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	want := testIdentity.LogHash()
	if !strings.Contains(page, want) {
		t.Fatalf("the key page does not show key_hash %s", want)
	}
	b.post(t, "/_idem/key/resolve", url.Values{"csrf": {formValue(t, page, "csrf")}, "ref": {formValue(t, page, "ref")}, "to": {"released"}})
	if !strings.Contains(b.logs.String(), "key_hash="+want) {
		t.Fatalf("the audit line does not carry key_hash=%s:\n%s", want, b.logs)
	}
}

// TestKeyPageReconcileState: the key page of an unknown record shows its
// reconciliation state from the store: the attempts, the last error and
// when the reconciler asks next.
func TestKeyPageReconcileState(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	page := openKey(t, b)
	for _, want := range []string{`id="reconcile-after">due now<`, `id="reconcile-attempts">0<`, "an unknown record is kept until it is settled"} {
		if !strings.Contains(page, want) {
			t.Errorf("the key page of a fresh unknown record lacks %q", want)
		}
	}
	if strings.Contains(page, `id="reconcile-error"`) {
		t.Error("the key page shows a reconcile error before any attempt")
	}
	rec, err := b.store.KeyGet(t.Context(), testIdentity)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.KeyReconcileFail(t.Context(), &idemstore.ReconcileFailParams{Identity: testIdentity, Token: rec.Token, Error: "upstream answered 503 <b>", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	page = openKey(t, b)
	for _, want := range []string{`id="reconcile-attempts">1<`, `id="reconcile-error">upstream answered 503 &lt;b&gt;<`, "(in 1h)"} {
		if !strings.Contains(page, want) {
			t.Errorf("the key page after a failed attempt lacks %q", want)
		}
	}
}
