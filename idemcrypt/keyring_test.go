package idemcrypt_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

func material(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return base64.StdEncoding.EncodeToString(b)
}

var parseCases = []struct {
	name, in string
	names    []string // nil: an error
	errHas   string
}{
	{"One", "k1:" + material(32) + "\n", []string{"k1"}, ""},
	{"TwoFirstSeals", "new:" + material(32) + "\nold:" + material(32), []string{"new", "old"}, ""},
	{"CommentsBlanksSpaces", "# keys\n\n  a.b_c-1 : " + material(32) + "  \r\n", []string{"a.b_c-1"}, ""},
	{"Empty", "", nil, "no key"},
	{"OnlyComments", "# nothing\n", nil, "no key"},
	{"NoColon", material(32), nil, "line 1: want NAME:BASE64"},
	{"Short", "k:" + material(16), nil, "16 bytes, want 32"},
	{"Long", "k:" + material(64), nil, "64 bytes, want 32"},
	{"NotBase64", "k:!!!!" + material(32)[4:], nil, "not valid standard base64"},
	{"BadName", "k y:" + material(32), nil, "only letters"},
	{"EmptyName", ":" + material(32), nil, "1 to 64 bytes"},
	{"Duplicate", "k:" + material(32) + "\nk:" + material(32), nil, "appears twice"},
	{"SecondLineBad", "k:" + material(32) + "\nj:x", nil, "line 2"},
}

func TestParseKeyring(t *testing.T) {
	t.Parallel()
	for _, tt := range parseCases {
		t.Run(tt.name, func(t *testing.T) {
			kr, err := idemcrypt.ParseKeyring([]byte(tt.in))
			if tt.names == nil {
				if err == nil || !strings.Contains(err.Error(), tt.errHas) {
					t.Fatalf("ParseKeyring = %v, %v; want an error with %q", kr, err, tt.errHas)
				}
				// Errors never echo material.
				for _, line := range strings.Split(tt.in, "\n") {
					if _, m, ok := strings.Cut(line, ":"); ok && len(strings.TrimSpace(m)) > 8 && strings.Contains(err.Error(), strings.TrimSpace(m)) {
						t.Fatalf("the error shows key material: %v", err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := kr.Names(); fmt.Sprint(got) != fmt.Sprint(tt.names) || kr.Primary() != tt.names[0] {
				t.Fatalf("names %v primary %q, want %v", got, kr.Primary(), tt.names)
			}
		})
	}
}

func FuzzParseKeyring(f *testing.F) {
	for _, tt := range parseCases {
		f.Add([]byte(tt.in))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		kr, err := idemcrypt.ParseKeyring(data)
		if err != nil {
			return
		}
		if len(kr.Names()) == 0 || !kr.Has(kr.Primary()) {
			t.Fatalf("a keyring without its sealing key: %v", kr)
		}
		// Every parsed keyring seals and opens.
		id := idemcrypt.Binding{Identity: idemstore.Identity{Scope: "s", Endpoint: "e", Key: "k"}}
		sealed, err := kr.Seal(id, &idemstore.Response{Status: 200, Body: []byte("x")})
		if err != nil {
			t.Fatal(err)
		}
		if got, err := kr.Open(id, sealed); err != nil || string(got.Body) != "x" {
			t.Fatalf("Open = %v, %v", got, err)
		}
	})
}

func TestLoadKeyring(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	m := material(32)
	path := filepath.Join(dir, "keys")
	if err := os.WriteFile(path, []byte("k1:"+m+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kr, err := idemcrypt.LoadKeyring(path)
	if err != nil || kr.Primary() != "k1" {
		t.Fatalf("LoadKeyring = %v, %v", kr, err)
	}
	for _, s := range []string{kr.String(), fmt.Sprintf("%v %+v %#v", kr, kr, kr)} {
		if strings.Contains(s, m) || !strings.Contains(s, "k1") {
			t.Fatalf("the keyring prints as %q", s)
		}
	}
	if _, err := idemcrypt.LoadKeyring(filepath.Join(dir, "missing")); err == nil {
		t.Fatal("a missing keys file loaded")
	}
}

func TestSealOpen(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.ParseKeyring([]byte("k1:" + material(32)))
	if err != nil {
		t.Fatal(err)
	}
	id := idemcrypt.Binding{
		Identity:    idemstore.Identity{Scope: "tenant", Endpoint: "POST /p", Key: "key"},
		Fingerprint: strings.Repeat("ab", 32),
		CreatedAt:   time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC),
	}
	resp := &idemstore.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}, "Link": {"a", "b"}}, Body: []byte("secret body")}
	sealed, err := kr.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	if sealed.Status != 201 || len(sealed.Header) != 0 || sealed.Sealed != "v2 k1" ||
		bytes.Contains(sealed.Body, []byte("secret")) {
		t.Fatalf("sealed = %+v", sealed)
	}
	again, _ := kr.Seal(id, resp)
	if bytes.Equal(again.Body, sealed.Body) {
		t.Fatal("two seals of one response are equal: the nonce is not fresh")
	}
	got, err := kr.Open(id, sealed)
	if err != nil || got.Status != 201 || string(got.Body) != "secret body" || fmt.Sprint(got.Header) != fmt.Sprint(resp.Header) {
		t.Fatalf("Open = %+v, %v", got, err)
	}
	// Any flipped bit fails to open.
	for i := range sealed.Body {
		c := *sealed
		c.Body = bytes.Clone(sealed.Body)
		c.Body[i] ^= 1
		if _, err := kr.Open(id, &c); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Fatalf("bit flipped at %d: %v, want ErrOpen", i, err)
		}
	}
	short := *sealed
	short.Body = sealed.Body[:5]
	if _, err := kr.Open(id, &short); !errors.Is(err, idemcrypt.ErrOpen) {
		t.Fatalf("truncated: %v", err)
	}
	// Unsealed responses pass as they are; nil stays nil.
	if got, err := kr.Open(id, resp); err != nil || got != resp {
		t.Fatalf("Open(plain) = %v, %v", got, err)
	}
	if got, err := kr.Seal(id, nil); got != nil || err != nil {
		t.Fatalf("Seal(nil) = %v, %v", got, err)
	}
}

// Every part of the binding is authenticated: a response sealed for one
// record opens on no record that differs in any of them.
func TestSealBindsTheRecord(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.ParseKeyring([]byte("k1:" + material(32)))
	if err != nil {
		t.Fatal(err)
	}
	b := idemcrypt.Binding{
		Identity:    idemstore.Identity{Scope: "tenant", Endpoint: "POST /p", Key: "key"},
		Fingerprint: strings.Repeat("ab", 32),
		CreatedAt:   time.Date(2026, 1, 2, 3, 4, 5, 678901000, time.UTC),
	}
	sealed, err := kr.Seal(b, &idemstore.Response{Status: 201, Body: []byte("secret")})
	if err != nil {
		t.Fatal(err)
	}
	// The same instant at another precision or in another zone is the same
	// binding: stores keep microseconds, in UTC or not.
	same := b
	same.CreatedAt = b.CreatedAt.In(time.FixedZone("x", 3600)).Add(999 * time.Nanosecond)
	if got, err := kr.Open(same, sealed); err != nil || string(got.Body) != "secret" {
		t.Fatalf("Open(same instant) = %v, %v", got, err)
	}
	for name, change := range map[string]func(*idemcrypt.Binding){
		"Scope":       func(b *idemcrypt.Binding) { b.Scope += "x" },
		"Endpoint":    func(b *idemcrypt.Binding) { b.Endpoint += "x" },
		"Key":         func(b *idemcrypt.Binding) { b.Key += "x" },
		"Fingerprint": func(b *idemcrypt.Binding) { b.Fingerprint = strings.Repeat("cd", 32) },
		"CreatedAt":   func(b *idemcrypt.Binding) { b.CreatedAt = b.CreatedAt.Add(time.Microsecond) },
		// Length prefixes: moving a byte from one part to the next changes
		// the binding.
		"Boundary": func(b *idemcrypt.Binding) { b.Scope, b.Endpoint = "tenantP", "OST /p" },
	} {
		other := b
		change(&other)
		if _, err := kr.Open(other, sealed); !errors.Is(err, idemcrypt.ErrOpen) {
			t.Errorf("%s changed: Open = %v, want ErrOpen", name, err)
		}
	}
}

// legacyV1 is a response sealed by the format v1 of idemcrypt (before the
// fingerprint and the creation time were bound), under the key "legacy" of
// 32 bytes 0x42, for the record of legacyID. It was written by the v1 code
// and must open for as long as v1 records may be stored.
var (
	legacyID     = idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: "key-v1"}
	legacyKey    = idemcrypt.Key{Name: "legacy", Secret: bytes.Repeat([]byte{0x42}, idemcrypt.KeySize)}
	legacySealed = "AH53U2VVnR5j3XtC4VXFCjCCJgB71RHo9+7W/sDrJf6nPluXHvq3pSuhYCVh7RJeVFqAy8RfPfkHeeu4e6wbO4nOshRt7dCIvzjm1NcXSkN/ObXql4dOdELcXguh9jPhld2BeIHK6B2A78c4phk3S5eBhQBBGMfOuuxfuZa1SZE="
)

func legacyResponse(t *testing.T) *idemstore.Response {
	t.Helper()
	body, err := base64.StdEncoding.DecodeString(legacySealed)
	if err != nil {
		t.Fatal(err)
	}
	return &idemstore.Response{Status: 201, Sealed: "v1 legacy", Body: body}
}

func TestOpenV1(t *testing.T) {
	t.Parallel()
	kr, err := idemcrypt.NewKeyring(legacyKey)
	if err != nil {
		t.Fatal(err)
	}
	// v1 binds the identity only: any fingerprint and creation time.
	b := idemcrypt.Binding{Identity: legacyID, Fingerprint: "whatever", CreatedAt: time.Now()}
	got, err := kr.Open(b, legacyResponse(t))
	if err != nil {
		t.Fatalf("Open(v1) = %v", err)
	}
	want := `201 map[Content-Type:[application/json] Location:[/v1/payments/pay_1]] {"id":"pay_1","card":"4242"}`
	if s := fmt.Sprintf("%d %v %s", got.Status, got.Header, got.Body); s != want {
		t.Fatalf("Open(v1) = %s, want %s", s, want)
	}
	if name, ok := idemcrypt.SealedBy(legacyResponse(t)); !ok || name != "legacy" {
		t.Fatalf("SealedBy(v1) = %q, %v", name, ok)
	}
	// Still bound to its identity.
	other := b
	other.Key = "key-v2"
	if _, err := kr.Open(other, legacyResponse(t)); !errors.Is(err, idemcrypt.ErrOpen) {
		t.Fatalf("v1 on another key: %v, want ErrOpen", err)
	}
	// A v2 ciphertext relabelled v1 (a downgrade) does not open, nor the
	// reverse.
	sealed, err := kr.Seal(b, &idemstore.Response{Status: 201, Body: []byte("x")})
	if err != nil {
		t.Fatal(err)
	}
	sealed.Sealed = "v1 legacy"
	if _, err := kr.Open(b, sealed); !errors.Is(err, idemcrypt.ErrOpen) {
		t.Fatalf("v2 relabelled v1: %v, want ErrOpen", err)
	}
	up := legacyResponse(t)
	up.Sealed = "v2 legacy"
	if _, err := kr.Open(b, up); !errors.Is(err, idemcrypt.ErrOpen) {
		t.Fatalf("v1 relabelled v2: %v, want ErrOpen", err)
	}
	// An unknown format is not a sealed response.
	v3 := legacyResponse(t)
	v3.Sealed = "v3 legacy"
	if _, ok := idemcrypt.SealedBy(v3); ok {
		t.Fatal("SealedBy accepts format v3")
	}
}

// A keys file that group or others can write is refused: any local user
// could put a key of their own first, and every response would be sealed
// under it. One only readable by others loads (the commands warn).
func TestLoadKeyringRefusesAWritableFile(t *testing.T) {
	t.Parallel()
	if runtime.GOOS == "windows" {
		t.Skip("no Unix permission bits")
	}
	for _, tt := range []struct {
		mode os.FileMode
		ok   bool
	}{
		{0o600, true}, {0o400, true}, {0o640, true}, {0o644, true},
		{0o620, false}, {0o602, false}, {0o666, false}, {0o660, false},
	} {
		path := filepath.Join(t.TempDir(), "keys")
		m := material(32)
		if err := os.WriteFile(path, []byte("k1:"+m+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(path, tt.mode); err != nil {
			t.Fatal(err)
		}
		kr, err := idemcrypt.LoadKeyring(path)
		switch {
		case tt.ok && err != nil:
			t.Errorf("mode %v: LoadKeyring = %v", tt.mode, err)
		case !tt.ok && (!errors.Is(err, idemcrypt.ErrKeysFileWritable) || kr != nil):
			t.Errorf("mode %v: LoadKeyring = %v, %v; want ErrKeysFileWritable", tt.mode, kr, err)
		case !tt.ok && (!strings.Contains(err.Error(), path) || !strings.Contains(err.Error(), tt.mode.String()) || strings.Contains(err.Error(), m)):
			t.Errorf("mode %v: the error %q should name the file and its mode, never the material", tt.mode, err)
		}
	}
}
