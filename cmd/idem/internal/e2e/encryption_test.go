package e2e

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/idembin"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// writeKeys writes a keys file of lines NAME:BASE64 and returns its path.
func writeKeys(t *testing.T, dir, file string, keys ...[2]string) string {
	t.Helper()
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s:%s\n", k[0], k[1])
	}
	path := filepath.Join(dir, file)
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func newKeyMaterial() string {
	b := make([]byte, idemcrypt.KeySize)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

var cursorRE = regexp.MustCompile(`cursor (\S+)`)

// TestEncryptionRotationTwoProcesses runs proxies of the built idem command
// on one PostgreSQL store with --encryption-keys-file. The table holds no
// byte of the answers. A second process with only the old key replays
// every record until rotation reaches it: interrupted after its first
// batch, the rotation leaves the rest replayable there, and the rotated
// records answer 503 store-unavailable, naming the key in the log, never
// ciphertext. `idem keys rotate-encryption --resume` finishes it; a process
// with only the new key then replays everything, byte for byte, and the
// upstream ran each request once.
func TestEncryptionRotationTwoProcesses(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	up := newUpstream(t, 0, nil)
	dir := t.TempDir()
	oldKey, newKey := [2]string{"old-2026", newKeyMaterial()}, [2]string{"new-2027", newKeyMaterial()}
	oldFile := writeKeys(t, dir, "old.keys", oldKey)
	bothFile := writeKeys(t, dir, "both.keys", newKey, oldKey)
	newFile := writeKeys(t, dir, "new.keys", newKey)

	a := e.startProxy("proxy-a", up.URL, 3, "--encryption-keys-file", oldFile)
	const n = 6
	keys := make([]string, n)
	first := make(map[string]answer)
	for i := range keys {
		keys[i] = fmt.Sprintf("rot-key-%d", i)
		got := post(t.Context(), a.URL+"/v1/payments", keys[i], `{"amount":100}`)
		if got.err != nil || got.status != http.StatusCreated || !bytes.Contains(got.body, []byte(`"payment"`)) {
			t.Fatalf("first %s: %v", keys[i], got)
		}
		first[keys[i]] = got
	}
	// At rest: sealed, no byte of the header values or the bodies.
	if got := e.count(`SELECT count(*) FROM ` + e.table("idem_keys") + ` WHERE response_header::text LIKE '%Idem-Sealed%old-2026%'`); got != n {
		t.Fatalf("%d records sealed under old-2026, want %d", got, n)
	}
	if got := e.count(`SELECT count(*) FROM ` + e.table("idem_keys") + ` WHERE response_header::text LIKE '%/v1/payments%'
		OR response_header::text LIKE '%application/json%' OR position('"payment"'::bytea IN response_body) > 0`); got != 0 {
		t.Fatalf("%d records show their answer in the table", got)
	}

	// The second process, with only the old key.
	b := e.startProxy("proxy-b-old-key", up.URL, 3, "--encryption-keys-file", oldFile)
	replay := func(p *proc, key string) answer {
		return post(t.Context(), p.URL+"/v1/payments", key, `{"amount":100}`)
	}
	for _, k := range keys {
		if got := replay(b, k); got.status != http.StatusCreated || got.replayed != "true" || !bytes.Equal(got.body, first[k].body) {
			t.Fatalf("replay of %s on the old-key process before rotation: %v", k, got)
		}
	}

	// Rotation, interrupted after its first batch of 2.
	both, err := idemcrypt.LoadKeyring(bothFile)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	prog, err := idemcrypt.Rotate(ctx, e.store, both, &idemcrypt.RotateConfig{Batch: 2, Progress: func(idemcrypt.RotateProgress) { cancel() }})
	cancel()
	if prog.Resealed != 2 || err == nil {
		t.Fatalf("interrupted rotation: %+v, %v; want 2 resealed and the context's error", prog, err)
	}
	rotated := map[string]bool{}
	recs, err := e.store.KeyList(t.Context(), &idemstore.ListParams{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range recs {
		name, _ := idemcrypt.SealedBy(r.Response)
		rotated[r.Key] = name == newKey[0]
	}
	for _, k := range keys {
		got := replay(b, k)
		switch {
		case rotated[k] && (got.status != http.StatusServiceUnavailable || got.code != idem.CodeStoreUnavailable):
			t.Fatalf("rotated %s on the old-key process: %v; want 503 store-unavailable", k, got)
		case rotated[k] && bytes.Contains(got.body, []byte("payment")):
			t.Fatalf("rotated %s on the old-key process shows an answer: %s", k, got.body)
		case !rotated[k] && (got.status != http.StatusCreated || !bytes.Equal(got.body, first[k].body)):
			t.Fatalf("%s, not yet rotated, on the old-key process: %v; want the replay", k, got)
		}
	}
	if !strings.Contains(b.output(), `(key \"new-2027\")`) {
		t.Fatalf("the old-key process did not log the missing key's name:\n%s", b.output())
	}
	if strings.Contains(b.output(), newKey[1]) || strings.Contains(b.output(), oldKey[1]) {
		t.Fatal("key material in the log")
	}

	// The command finishes the rotation from the cursor.
	cmd := exec.Command(idembin.Path(t), "keys", "rotate-encryption", "--store", e.storeURL(2),
		"--encryption-keys-file", bothFile, "--batch-size", "2", "--resume", encodeCursorForTest(prog.Cursor))
	cmd.Env = idembin.Environ()
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("idem keys rotate-encryption: %v\n%s", err, out)
	}
	// The interrupted pass goes on from the cursor (2 batches of 2), then
	// a whole pass (3 batches) finds nothing left.
	if got := len(cursorRE.FindAllSubmatch(out, -1)); got != 5 || bytes.Count(out, []byte("pass 1 ")) != 2 ||
		!bytes.Contains(out, []byte("Done in 2 passes")) || !bytes.Contains(out, []byte("4 re-encrypted under \"new-2027\"")) {
		t.Fatalf("rotate-encryption output (want 2 progress lines of pass 1 and 3 of pass 2, 4 re-encrypted):\n%s", out)
	}
	if bytes.Contains(out, []byte(newKey[1])) || bytes.Contains(out, []byte(oldKey[1])) {
		t.Fatal("key material in the command's output")
	}
	if got := e.count(`SELECT count(*) FROM ` + e.table("idem_keys") + ` WHERE response_header::text LIKE '%Idem-Sealed%new-2027%'`); got != n {
		t.Fatalf("%d records sealed under new-2027 after rotation, want %d", got, n)
	}

	// With only the new key, everything replays.
	c := e.startProxy("proxy-c-new-key", up.URL, 3, "--encryption-keys-file", newFile)
	for _, k := range keys {
		got := replay(c, k)
		if got.status != http.StatusCreated || got.replayed != "true" || !bytes.Equal(got.body, first[k].body) {
			t.Fatalf("replay of %s with the new key after rotation: %v", k, got)
		}
		if runs := up.executions(k); runs != 1 {
			t.Fatalf("the upstream ran %s %d times", k, runs)
		}
	}
}

// encodeCursorForTest is the cursor as rotate-encryption prints it.
func encodeCursorForTest(id *idemstore.Identity) string {
	b, _ := json.Marshal(id)
	return base64.RawURLEncoding.EncodeToString(b)
}
