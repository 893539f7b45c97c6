package console_test

import (
	"bytes"
	"context"
	"crypto/tls"
	"html"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
)

const testToken = "test-console-token-0123456789abcdef"

// bundle is what setup returns.
type bundle struct {
	clock   *idemtest.Clock
	store   *idemmem.Store
	outbox  *memOutbox
	handler http.Handler
	logs    *syncBuffer
	token   string
}

// setup returns a console over an in-memory store and outbox, with a test
// clock and a captured log. modify may change the Config before New.
func setup(t *testing.T, modify ...func(*console.Config)) *bundle {
	t.Helper()
	clock := idemtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	b := &bundle{
		clock:  clock,
		store:  idemmem.New(&idemmem.Config{Now: clock.Now}),
		outbox: &memOutbox{},
		logs:   &syncBuffer{},
	}
	cfg := console.Config{
		Store:  b.store,
		Token:  testToken,
		Outbox: b.outbox,
		Now:    clock.Now,
		Logger: slog.New(slog.NewTextHandler(b.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
	for _, m := range modify {
		m(&cfg)
	}
	h, err := console.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	b.handler, b.token = h, cfg.Token
	return b
}

// do serves req and returns the recorded response.
func (b *bundle) do(req *http.Request) *httptest.ResponseRecorder {
	rec := httptest.NewRecorder()
	b.handler.ServeHTTP(rec, req)
	return rec
}

// get GETs path with the bearer token.
func (b *bundle) get(t *testing.T, path string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer "+b.token)
	return b.do(req)
}

// post POSTs form to path with the bearer token, as a same-origin browser
// form would.
func (b *bundle) post(t *testing.T, path string, form url.Values) *httptest.ResponseRecorder {
	t.Helper()
	req := postRequest(path, form)
	req.Header.Set("Authorization", "Bearer "+b.token)
	return b.do(req)
}

func postRequest(path string, form url.Values) *http.Request {
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	return req
}

// login signs in through the form and returns the session cookie.
func (b *bundle) login(t *testing.T) *http.Cookie {
	t.Helper()
	rec := b.do(postRequest("/_idem/login", url.Values{"token": {b.token}, "next": {"/_idem/"}}))
	if rec.Code != http.StatusSeeOther {
		t.Fatalf("login: status %d, want 303", rec.Code)
	}
	for _, c := range rec.Result().Cookies() {
		if c.Name == "idem_console" {
			return c
		}
	}
	t.Fatal("login set no session cookie")
	return nil
}

// csrf GETs the overview with the bearer token and returns its CSRF token.
func (b *bundle) csrf(t *testing.T) string {
	t.Helper()
	return formValue(t, b.get(t, "/_idem/").Body.String(), "csrf")
}

var (
	inputRE = regexp.MustCompile(`<input type="hidden" name="([a-z_]+)" value="([^"]*)">`)
	hrefRE  = regexp.MustCompile(`href="([^"]*)"`)
)

// formValue returns the value of the first hidden input named name in page.
func formValue(t *testing.T, page, name string) string {
	t.Helper()
	for _, m := range inputRE.FindAllStringSubmatch(page, -1) {
		if m[1] == name {
			return html.UnescapeString(m[2])
		}
	}
	t.Fatalf("no hidden input %q in the page:\n%s", name, page)
	return ""
}

// links returns the page's link targets that start with prefix.
func links(page, prefix string) []string {
	var out []string
	for _, m := range hrefRE.FindAllStringSubmatch(page, -1) {
		if u := html.UnescapeString(m[1]); strings.HasPrefix(u, prefix) {
			out = append(out, u)
		}
	}
	return out
}

var testIdentity = idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "raw-key-7f3a9c"}

// reserve creates an in_progress record and returns its token.
func reserve(t *testing.T, s idemstore.Store, id idemstore.Identity) string {
	t.Helper()
	token := "tok-" + id.Key + "-" + time.Now().Format("150405.000000000")
	res, err := s.KeyReserve(context.Background(), &idemstore.ReserveParams{
		Identity: id, Fingerprint: "fp-" + id.Key, Token: token,
		Lease: time.Minute, TTL: 24 * time.Hour, LeaseExpiredState: idemstore.StateUnknown,
	})
	if err != nil || !res.Reserved {
		t.Fatalf("reserve %v: %v %+v", id, err, res)
	}
	return token
}

// unknown creates an unknown record.
func unknown(t *testing.T, s idemstore.Store, id idemstore.Identity) {
	t.Helper()
	token := reserve(t, s, id)
	if err := s.KeyMarkUnknown(context.Background(), &idemstore.FinishParams{Identity: id, Token: token}); err != nil {
		t.Fatal(err)
	}
}

// completed creates a completed record with resp.
func completed(t *testing.T, s idemstore.Store, id idemstore.Identity, resp *idemstore.Response) {
	t.Helper()
	token := reserve(t, s, id)
	if err := s.KeyComplete(context.Background(), &idemstore.CompleteParams{Identity: id, Token: token, Response: resp}); err != nil {
		t.Fatal(err)
	}
}

// get reads a record, failing the test if it is missing.
func getRecord(t *testing.T, s idemstore.Store, id idemstore.Identity) *idemstore.Record {
	t.Helper()
	rec, err := s.KeyGet(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rec
}

// syncBuffer is a bytes.Buffer safe for concurrent writers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// memOutbox is an in-memory console.Outbox.
type memOutbox struct {
	mu   sync.Mutex
	msgs []*console.OutboxMessage
	err  error
}

func (o *memOutbox) add(m console.OutboxMessage) {
	o.mu.Lock()
	defer o.mu.Unlock()
	m.ID = int64(len(o.msgs) + 1)
	o.msgs = append(o.msgs, &m)
}

func (o *memOutbox) state(id int64) string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.msgs[id-1].State
}

func (o *memOutbox) MessageList(_ context.Context, p *console.OutboxListParams) ([]*console.OutboxMessage, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return nil, o.err
	}
	var out []*console.OutboxMessage
	for _, m := range o.msgs {
		if m.State == p.State && m.ID > p.AfterID && len(out) < p.Limit {
			cp := *m
			out = append(out, &cp)
		}
	}
	return out, nil
}

func (o *memOutbox) MessageCounts(context.Context) (map[string]int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.err != nil {
		return nil, o.err
	}
	counts := map[string]int{}
	for _, m := range o.msgs {
		counts[m.State]++
	}
	return counts, nil
}

func (o *memOutbox) MessageRedrive(_ context.Context, id int64) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	i := slices.IndexFunc(o.msgs, func(m *console.OutboxMessage) bool { return m.ID == id && m.State == "dead" })
	if i < 0 {
		return console.ErrNoDeadMessage
	}
	o.msgs[i].State, o.msgs[i].Attempts = "pending", 0
	return nil
}

var _ io.Writer = (*syncBuffer)(nil)

func (b *bundle) tlsState() *tls.ConnectionState { return &tls.ConnectionState{} }
