package idem_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

const secretMarker = "4111-SECRET-CARD"

func testKeyring(t *testing.T, names ...string) *idemcrypt.Keyring {
	t.Helper()
	keys := make([]idemcrypt.Key, len(names))
	for i, n := range names {
		keys[i] = idemcrypt.Key{Name: n, Secret: make([]byte, idemcrypt.KeySize)}
		rand.Read(keys[i].Secret)
	}
	kr, err := idemcrypt.NewKeyring(keys...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

// secretHandler answers with the marker in a stored header and the body.
func secretHandler(w http.ResponseWriter, r *http.Request) {
	io.Copy(io.Discard, r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Location", "/v1/cards/"+secretMarker)
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"card":{"number":%q,"brand":"visa"},"token":"tok_%s","id":"c_1"}`+"\n", secretMarker, secretMarker)
}

func storedRecord(t *testing.T, b *testBundle) *idemstore.Record {
	t.Helper()
	recs, err := b.store.KeyList(t.Context(), &idemstore.ListParams{})
	if err != nil || len(recs) != 1 {
		t.Fatalf("KeyList = %d records, %v; want 1", len(recs), err)
	}
	return recs[0]
}

func TestKeyringSealsStoredResponses(t *testing.T) {
	t.Parallel()
	b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1")}}, secretHandler)
	first := b.do(t, "POST", "key-one", `{"amount":1}`)
	if first.Code != http.StatusCreated || !strings.Contains(first.Body.String(), secretMarker) {
		t.Fatalf("first: %d %s", first.Code, first.Body)
	}
	rec := storedRecord(t, b)
	if name, ok := idemcrypt.SealedBy(rec.Response); !ok || name != "k1" {
		t.Fatalf("stored response is not sealed by k1: %v %q", ok, name)
	}
	raw := fmt.Sprint(rec.Response.Header) + string(rec.Response.Body)
	if strings.Contains(raw, secretMarker) || strings.Contains(raw, "/v1/cards") {
		t.Fatalf("the store holds plaintext: %q", raw)
	}
	second := b.do(t, "POST", "key-one", `{"amount":1}`)
	if second.Code != http.StatusCreated || !bytes.Equal(second.Body.Bytes(), first.Body.Bytes()) ||
		second.Header().Get("Location") != first.Header().Get("Location") || second.Header().Get(idem.HeaderReplayed) != "true" {
		t.Fatalf("replay: %d %v %s", second.Code, second.Header(), second.Body)
	}
	if second.Header().Get("Idem-Sealed") != "" {
		t.Fatal("the replay shows the sealed marker header")
	}
	if n := b.calls.Load(); n != 1 {
		t.Fatalf("handler ran %d times", n)
	}
}

// getCounter is a memory store (transactions included) that counts KeyGet.
type getCounter struct {
	*idemmem.Store
	gets atomic.Int64
}

func (s *getCounter) KeyGet(ctx context.Context, id idemstore.Identity) (*idemstore.Record, error) {
	s.gets.Add(1)
	return s.Store.KeyGet(ctx, id)
}

// The completion carries the reserved record, so sealing it for its
// fingerprint and creation time costs no read: a new key stays one round
// trip to reserve and one to complete, in plain mode and transactional.
func TestKeyringSealsWithoutReading(t *testing.T) {
	t.Parallel()
	for _, tx := range []bool{false, true} {
		store := &getCounter{Store: idemmem.New(nil)}
		h := idem.New(store, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1"), Transactional: tx}})(http.HandlerFunc(secretHandler))
		do := func() *httptest.ResponseRecorder {
			r := httptest.NewRequest("POST", "/v1/cards", strings.NewReader(`{"amount":1}`))
			r.Header.Set(idem.HeaderKey, "key-one")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			return w
		}
		if w := do(); w.Code != http.StatusCreated {
			t.Fatalf("transactional %v: first: %d %s", tx, w.Code, w.Body)
		}
		if n := store.gets.Load(); n != 0 {
			t.Fatalf("transactional %v: %d KeyGet calls to seal the completion, want 0", tx, n)
		}
		recs, err := store.KeyList(t.Context(), &idemstore.ListParams{})
		if err != nil || len(recs) != 1 {
			t.Fatalf("KeyList = %v, %v", recs, err)
		}
		if v := recs[0].Response.Sealed; v != "v2 k1" {
			t.Fatalf("transactional %v: stored sealed %q, want v2 k1", tx, v)
		}
		if w := do(); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), secretMarker) {
			t.Fatalf("transactional %v: replay: %d %s", tx, w.Code, w.Body)
		}
	}
}

func TestSealedRecordWithoutItsKeyIsUnavailable(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		kr   func(t *testing.T) *idemcrypt.Keyring
	}{
		{"OtherKey", func(t *testing.T) *idemcrypt.Keyring { return testKeyring(t, "k2") }},
		{"NoKeyring", func(t *testing.T) *idemcrypt.Keyring { return nil }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			writer := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1")}}, secretHandler)
			if w := writer.do(t, "POST", "key-one", `{}`); w.Code != http.StatusCreated {
				t.Fatalf("first: %d", w.Code)
			}
			// A second middleware on the same store, without the key.
			b := setup(t, nil, secretHandler)
			b.handler = idem.New(writer.store, &idem.Config{
				GuardConfig: idem.GuardConfig{Keyring: tt.kr(t), Logger: slog.New(slog.NewTextHandler(b.logs, nil)), Clock: b.clock},
			})(http.HandlerFunc(secretHandler))
			w := b.do(t, "POST", "key-one", `{}`)
			requireProblem(t, w, http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
			if strings.Contains(w.Body.String(), secretMarker) {
				t.Fatalf("the answer shows the response: %s", w.Body)
			}
			logs := b.logs.String()
			if !strings.Contains(logs, `key \"k1\"`) || !strings.Contains(logs, "store unavailable") {
				t.Fatalf("the log does not name the missing key k1:\n%s", logs)
			}
			if strings.Contains(logs, secretMarker) {
				t.Fatalf("the log shows the response:\n%s", logs)
			}
		})
	}
}

func TestRedactJSONFields(t *testing.T) {
	t.Parallel()
	for _, kr := range []*idemcrypt.Keyring{nil, testKeyring(t, "k1")} {
		b := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: kr}, Redact: idem.RedactJSONFields("token", "card.number", "absent.x")}, secretHandler)
		first := b.do(t, "POST", "key-one", `{}`)
		if !strings.Contains(first.Body.String(), `"tok_`) || !strings.Contains(first.Body.String(), `"number"`) {
			t.Fatalf("the first answer was redacted: %s", first.Body)
		}
		second := b.do(t, "POST", "key-one", `{}`)
		var got map[string]any
		if err := json.Unmarshal(second.Body.Bytes(), &got); err != nil {
			t.Fatalf("replay body %s: %v", second.Body, err)
		}
		want := map[string]any{"card": map[string]any{"brand": "visa"}, "id": "c_1"}
		if fmt.Sprint(got) != fmt.Sprint(want) || !strings.HasSuffix(second.Body.String(), "\n") {
			t.Fatalf("replay body %q, want %v", second.Body, want)
		}
		if second.Header().Get("Location") != first.Header().Get("Location") {
			t.Fatal("redaction changed the replayed headers")
		}
	}
}

func TestRedactJSONFieldsLeavesOtherBodies(t *testing.T) {
	t.Parallel()
	redact := idem.RedactJSONFields("a", "b.c")
	json := http.Header{"Content-Type": {"application/json"}}
	for _, tt := range []struct {
		header     http.Header
		body, want string
	}{
		{json, `{"a":1,"z":2}`, `{"z":2}`},
		{json, `{"b":[{"c":1,"d":2},{"c":3}],"z":"<&>"}`, `{"b":[{"d":2},{}],"z":"<&>"}`},
		{json, `{"n":1.50000000000000000001}`, `{"n":1.50000000000000000001}`},
		{json, `[{"a":1}]`, `[{"a":1}]`},
		{json, `{"a":1} trailing`, `{"a":1} trailing`},
		{json, `not json`, `not json`},
		{http.Header{"Content-Type": {"text/plain"}}, `{"a":1}`, `{"a":1}`},
	} {
		if got := string(redact(nil, 200, tt.header, []byte(tt.body))); got != tt.want {
			t.Errorf("redact(%s) = %s, want %s", tt.body, got, tt.want)
		}
	}
}

// With EncryptionRequired a stored response that is not sealed (planted by
// whoever can write to the store, or left from before encryption) is never
// replayed, and the request is never run again: 500 response-untrusted,
// fail-open or not. A sealed one replays as before.
func TestEncryptionRequiredRefusesUnsealed(t *testing.T) {
	t.Parallel()
	for _, failOpen := range []bool{false, true} {
		// A middleware without a keyring stores the answer in the clear.
		plain := setup(t, nil, secretHandler)
		if w := plain.do(t, "POST", "key-one", `{}`); w.Code != http.StatusCreated {
			t.Fatalf("first: %d", w.Code)
		}
		b := setup(t, nil, secretHandler)
		b.handler = idem.New(plain.store, &idem.Config{
			GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1"), EncryptionRequired: true, FailOpen: failOpen, Logger: slog.New(slog.NewTextHandler(b.logs, nil)), Clock: b.clock},
		})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			b.calls.Add(1)
			secretHandler(w, r)
		}))
		w := b.do(t, "POST", "key-one", `{}`)
		requireProblem(t, w, http.StatusInternalServerError, idem.CodeResponseUntrusted)
		if strings.Contains(w.Body.String(), secretMarker) || w.Header().Get("Retry-After") != "" {
			t.Fatalf("fail-open %v: the refusal %v %s", failOpen, w.Header(), w.Body)
		}
		if n := b.calls.Load(); n != 0 {
			t.Fatalf("fail-open %v: the handler ran %d times on a refused replay", failOpen, n)
		}
		logs := b.logs.String()
		if !strings.Contains(logs, "not sealed") || strings.Contains(logs, secretMarker) || strings.Contains(logs, "key-one") {
			t.Fatalf("fail-open %v: the log does not say why, or shows the key or the response:\n%s", failOpen, logs)
		}
		// A new key is sealed and replays.
		for range 2 {
			if w := b.do(t, "POST", "key-two", `{}`); w.Code != http.StatusCreated || !strings.Contains(w.Body.String(), secretMarker) {
				t.Fatalf("fail-open %v: sealed key: %d %s", failOpen, w.Code, w.Body)
			}
		}
		if n := b.calls.Load(); n != 1 {
			t.Fatalf("fail-open %v: the handler ran %d times for key-two", failOpen, n)
		}
	}
}

func TestEncryptionRequiredNeedsAKeyring(t *testing.T) {
	t.Parallel()
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "EncryptionRequired") {
			t.Fatalf("recover() = %v, want a panic naming EncryptionRequired", r)
		}
	}()
	idem.New(idemmem.New(nil), &idem.Config{GuardConfig: idem.GuardConfig{EncryptionRequired: true}})
}

// A Guard refuses the same way: ErrResponseUntrusted, the function not run.
func TestGuardEncryptionRequired(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	store := idemmem.New(nil)
	call := idem.Call{Identity: idemstore.Identity{Endpoint: "charge", Key: "k1"}, Fingerprint: idem.FingerprintBytes("charge", []byte("x"))}
	ran := 0
	fn := func(context.Context) (idem.Result, error) { ran++; return idem.Result{Body: []byte(secretMarker)}, nil }
	if _, _, err := idem.NewGuard(store, nil).Run(ctx, call, fn); err != nil {
		t.Fatal(err)
	}
	g := idem.NewGuard(store, &idem.GuardConfig{Keyring: testKeyring(t, "k1"), EncryptionRequired: true, FailOpen: true})
	res, replayed, err := g.Run(ctx, call, fn)
	var e *idem.Error
	if !errors.Is(err, idem.ErrResponseUntrusted) || !errors.As(err, &e) || e.Code() != idem.CodeResponseUntrusted || replayed || res.Body != nil {
		t.Fatalf("Run = %+v, %v, %v; want ErrResponseUntrusted", res, replayed, err)
	}
	if ran != 1 {
		t.Fatalf("the function ran %d times, want 1", ran)
	}
}

// A record under a key this process lacks completed: even the development
// fail-open switch does not run its request again (503, handler not run).
func TestSealedRecordWithoutItsKeyNeverFailsOpen(t *testing.T) {
	t.Parallel()
	writer := setup(t, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k1")}}, secretHandler)
	if w := writer.do(t, "POST", "key-one", `{}`); w.Code != http.StatusCreated {
		t.Fatalf("first: %d", w.Code)
	}
	b := setup(t, nil, secretHandler)
	ran := 0
	b.handler = idem.New(writer.store, &idem.Config{GuardConfig: idem.GuardConfig{Keyring: testKeyring(t, "k2"), FailOpen: true, Clock: b.clock, Logger: slog.New(slog.NewTextHandler(b.logs, nil))}})(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ran++
		secretHandler(w, r)
	}))
	requireProblem(t, b.do(t, "POST", "key-one", `{}`), http.StatusServiceUnavailable, idem.CodeStoreUnavailable)
	if ran != 0 {
		t.Fatalf("fail-open ran the handler %d times for a completed record", ran)
	}
}
