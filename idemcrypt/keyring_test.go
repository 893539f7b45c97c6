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
	"strings"
	"testing"

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
		id := idemstore.Identity{Scope: "s", Endpoint: "e", Key: "k"}
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
	id := idemstore.Identity{Scope: "tenant", Endpoint: "POST /p", Key: "key"}
	resp := &idemstore.Response{Status: 201, Header: http.Header{"Location": {"/p/1"}, "Link": {"a", "b"}}, Body: []byte("secret body")}
	sealed, err := kr.Seal(id, resp)
	if err != nil {
		t.Fatal(err)
	}
	if sealed.Status != 201 || len(sealed.Header) != 1 || sealed.Header.Get(idemcrypt.HeaderSealed) != "v1 k1" ||
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
