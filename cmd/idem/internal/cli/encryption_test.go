package cli

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

func writeKeysFile(t *testing.T, lines ...string) (path string, material []string) {
	t.Helper()
	var b strings.Builder
	for _, name := range lines {
		k := make([]byte, 32)
		rand.Read(k)
		m := base64.StdEncoding.EncodeToString(k)
		material = append(material, m)
		b.WriteString(name + ":" + m + "\n")
	}
	path = filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, material
}

// idem proxy --encryption-keys-file keeps the answers out of the database
// file, --redact-json-fields keeps fields out of replays, and idem keys
// show opens the record with the keys file (from its variable) and fails
// clearly without it.
func TestProxyEncryptionKeysFile(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Location", "/v1/cards/SECRET-LOC")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"token":"SECRET-TOKEN","card":{"number":"SECRET-CARD","brand":"visa"}}`)
	}))
	defer up.Close()
	keysPath, material := writeKeysFile(t, "k1")
	db := filepath.Join(t.TempDir(), "idem.db")
	base, e, stop := startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+db,
		"--encryption-keys-file", keysPath, "--redact-json-fields", "token, card.number")
	r1, b1 := postTo(t, base+"/v1/payments", "k", "")
	r2, b2 := postTo(t, base+"/v1/payments", "k", "")
	if r1.StatusCode != http.StatusCreated || !strings.Contains(b1, "SECRET-TOKEN") || !strings.Contains(b1, "SECRET-CARD") {
		t.Fatalf("first answer %d %s: want it whole", r1.StatusCode, b1)
	}
	if r2.StatusCode != http.StatusCreated || r2.Header.Get("Idempotent-Replayed") != "true" ||
		b2 != `{"card":{"brand":"visa"}}` || r2.Header.Get("Location") != "/v1/cards/SECRET-LOC" {
		t.Fatalf("replay %d %v %s: want the redacted body", r2.StatusCode, r2.Header, b2)
	}
	if code := stop(); code != ExitOK {
		t.Fatalf("exit %d: %s", code, e.stderr)
	}
	logs := e.stderr.String()
	if !strings.Contains(logs, "encryption_keys=k1") || strings.Contains(logs, material[0]) {
		t.Fatalf("the start-up log should name the keys, never their material:\n%s", logs)
	}
	files, _ := filepath.Glob(db + "*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte("SECRET")) || bytes.Contains(b, []byte("/v1/cards")) {
			t.Fatalf("%s holds a stored answer in the clear", f)
		}
	}

	show := []string{"show", "--store", "sqlite:" + db, "--endpoint", "POST /v1/payments", "k"}
	code, out, errOut := runKeysIn(t, openExisting, map[string]string{"IDEM_ENCRYPTION_KEYS_FILE": keysPath}, show...)
	if code != ExitOK || !strings.Contains(out, `"brand":"visa"`) || !strings.Contains(out, "/v1/cards/SECRET-LOC") {
		t.Fatalf("keys show with the keys file: %d\n%s\n%s", code, out, errOut)
	}
	code, out, errOut = runKeysIn(t, openExisting, nil, show...)
	if code != ExitError || !strings.Contains(errOut, `(key "k1")`) || strings.Contains(out+errOut, "visa") {
		t.Fatalf("keys show without the keys file: %d\n%s\n%s", code, out, errOut)
	}
}

func TestKeysRotateEncryptionUsage(t *testing.T) {
	t.Parallel()
	short := filepath.Join(t.TempDir(), "short")
	os.WriteFile(short, []byte("k1:c2hvcnQ=\n"), 0o600)
	for _, tt := range []struct {
		args    []string
		wantErr string
	}{
		{[]string{"rotate-encryption", "--store", "memory:"}, "--encryption-keys-file (or IDEM_ENCRYPTION_KEYS_FILE) is required"},
		{[]string{"rotate-encryption", "--store", "memory:", "--encryption-keys-file", short}, "5 bytes, want 32"},
		{[]string{"rotate-encryption", "--store", "memory:", "--encryption-keys-file", short, "--resume", "nope"}, "not a cursor"},
		{[]string{"rotate-encryption", "--store", "memory:", "--encryption-keys-file", short, "--batch-size", "0"}, "batch-size"},
	} {
		code, _, errOut := runKeysIn(t, openExisting, nil, tt.args...)
		if code != ExitUsage || !strings.Contains(errOut, tt.wantErr) || strings.Contains(errOut, "c2hvcnQ") {
			t.Errorf("%v: exit %d, %q; want a usage error with %q", tt.args, code, errOut, tt.wantErr)
		}
	}
}

func TestRedactFieldsFlag(t *testing.T) {
	t.Parallel()
	var got []string
	v := fieldsValue{&got}
	if err := v.Set(" a , b.c "); err != nil || strings.Join(got, "|") != "a|b.c" {
		t.Fatalf("Set = %v, %v", got, err)
	}
	for _, bad := range []string{"", "a,,b", ".a", "a.", "a..b"} {
		if err := v.Set(bad); err == nil {
			t.Errorf("Set(%q) accepted", bad)
		}
	}
}

// `idem maintain --encryption-keys-file` stores the answers its reconciler
// finds sealed, as the middleware would.
func TestMaintainReconcilesSealed(t *testing.T) {
	t.Parallel()
	lookup := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"card":"SECRET-CARD"}`)
	}))
	defer lookup.Close()
	keysPath, _ := writeKeysFile(t, "k1")
	store := idemmem.New(nil)
	ctx := t.Context()
	id := idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "k-applied"}
	if _, err := store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
		Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	e := newTestEnv(map[string]string{"IDEM_ENCRYPTION_KEYS_FILE": keysPath})
	if err := runMaintainIn(ctx, e, sharedOpener(store), "--once", "--store", "memory:", "--reconcile-url", lookup.URL+"/?k={key}", "--reconcile-unscoped",
		"--reconcile-grace", "0"); err != nil { // the lease ended at once, nothing was sent
		t.Fatalf("idem maintain --once: %v\nstderr: %s", err, e.stderr)
	}
	rec, err := store.KeyGet(ctx, id)
	if err != nil || rec.State != idemstore.StateCompleted {
		t.Fatalf("record %+v, %v; want completed", rec, err)
	}
	if name, ok := idemcrypt.SealedBy(rec.Response); !ok || name != "k1" || strings.Contains(string(rec.Response.Body), "SECRET") {
		t.Fatalf("the reconciled answer is stored in the clear: %+v", rec.Response)
	}
}

// idem proxy --encryption-required refuses to replay an answer stored in
// the clear (500 response-untrusted) and never forwards its request again;
// IDEM_ENCRYPTION_REQUIRED is its fallback on proxy and payments, and it
// needs a keys file.
func TestProxyEncryptionRequired(t *testing.T) {
	t.Parallel()
	var calls atomic.Int64
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
		io.WriteString(w, `{"id":"PLANTED-OR-OLD"}`)
	}))
	defer up.Close()
	db := filepath.Join(t.TempDir(), "idem.db")
	base, e, stop := startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+db)
	if r, _ := postTo(t, base+"/v1/payments", "k", ""); r.StatusCode != http.StatusCreated {
		t.Fatalf("first: %d", r.StatusCode)
	}
	if code := stop(); code != ExitOK {
		t.Fatalf("exit %d: %s", code, e.stderr)
	}
	keysPath, _ := writeKeysFile(t, "k1")
	base, e, stop = startProxy(t, "--upstream", up.URL, "--store", "sqlite:"+db, "--encryption-keys-file", keysPath, "--encryption-required")
	r, body := postTo(t, base+"/v1/payments", "k", "")
	if r.StatusCode != http.StatusInternalServerError || !strings.Contains(body, `"code":"response-untrusted"`) || strings.Contains(body, "PLANTED") {
		t.Fatalf("replay of a record in the clear: %d %s; want 500 response-untrusted", r.StatusCode, body)
	}
	if r, body := postTo(t, base+"/v1/payments", "k2", ""); r.StatusCode != http.StatusCreated || !strings.Contains(body, "PLANTED-OR-OLD") {
		t.Fatalf("a new key: %d %s", r.StatusCode, body)
	}
	if n := calls.Load(); n != 2 {
		t.Fatalf("the upstream was called %d times, want 2 (k once, k2 once)", n)
	}
	if code := stop(); code != ExitOK {
		t.Fatalf("exit %d: %s", code, e.stderr)
	}

	vars := map[string]string{"IDEM_ENCRYPTION_REQUIRED": "1", "IDEM_ENCRYPTION_KEYS_FILE": keysPath}
	po, err := parseProxy([]string{"--upstream", up.URL}, newTestEnv(vars).env)
	if err != nil || !po.keyring.required {
		t.Fatalf("parseProxy with IDEM_ENCRYPTION_REQUIRED=1: required %v, %v", po != nil && po.keyring.required, err)
	}
	pa, err := parsePayments(nil, newTestEnv(vars).env)
	if err != nil || !pa.keyring.required {
		t.Fatalf("parsePayments with IDEM_ENCRYPTION_REQUIRED=1: required %v, %v", pa != nil && pa.keyring.required, err)
	}
	for _, args := range [][]string{{"proxy", "--upstream", up.URL, "--encryption-required"}, {"payments", "--encryption-required"}} {
		te := newTestEnv(nil)
		if code := run(t.Context(), args, te.env); code != ExitUsage || !strings.Contains(te.stderr.String(), "--encryption-keys-file") {
			t.Fatalf("%v without a keys file: exit %d, %s", args, code, te.stderr)
		}
	}
}

// A keys file group or others may write is refused at start; one others
// may read starts with a warning naming the file, never its keys.
func TestKeysFilePermissions(t *testing.T) {
	t.Parallel()
	keysPath, material := writeKeysFile(t, "k1")
	for _, tt := range []struct {
		mode     os.FileMode
		wantCode int
		wantLog  string
	}{
		{0o600, ExitOK, ""},
		{0o644, ExitOK, "readable by other users"},
		{0o664, ExitUsage, "writable by its group or by others"},
		{0o606, ExitUsage, "writable by its group or by others"},
	} {
		if err := os.Chmod(keysPath, tt.mode); err != nil {
			t.Fatal(err)
		}
		te := newTestEnv(map[string]string{"IDEM_ENCRYPTION_KEYS_FILE": keysPath})
		code := run(t.Context(), []string{"keys", "rotate-encryption", "--store", "memory:"}, te.env)
		out := te.stderr.String()
		if code != tt.wantCode || (tt.wantLog != "" && !strings.Contains(out, tt.wantLog)) || strings.Contains(out, material[0]) {
			t.Errorf("mode %v: exit %d (want %d), stderr:\n%s\nwant %q", tt.mode, code, tt.wantCode, out, tt.wantLog)
		}
		if tt.wantLog == "" && strings.Contains(out, "readable by other") {
			t.Errorf("mode %v: a warning for a private file:\n%s", tt.mode, out)
		}
	}
}
