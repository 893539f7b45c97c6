package idemcrypt

import (
	"bufio"
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
)

// KeySize is the size of every key: AES-256.
const KeySize = 32

// maxNameLen bounds a key name, which is stored in the clear on every
// sealed record.
const maxNameLen = 64

// Key is one named key of a Keyring.
type Key struct {
	// Name identifies the key in the stored records and in logs: letters,
	// digits, '.', '_' and '-', at most 64 bytes. It is not secret.
	Name string
	// Secret is the key material: KeySize random bytes.
	Secret []byte
}

// Keyring holds the keys that seal and open stored responses. The first key
// seals; every key opens. A Keyring is immutable and safe for concurrent
// use. It never prints its key material (String gives the names only).
type Keyring struct {
	primary string
	names   []string
	aeads   map[string]cipher.AEAD
}

// NewKeyring returns a keyring of keys, the first of which seals. Names must
// be valid and distinct, and every Secret KeySize bytes long; the secrets
// are not retained beyond the ciphers made from them.
func NewKeyring(keys ...Key) (*Keyring, error) {
	if len(keys) == 0 {
		return nil, errors.New("idemcrypt: a keyring needs at least one key")
	}
	kr := &Keyring{aeads: make(map[string]cipher.AEAD, len(keys))}
	for _, k := range keys {
		if err := validName(k.Name); err != nil {
			return nil, err
		}
		if _, dup := kr.aeads[k.Name]; dup {
			return nil, fmt.Errorf("idemcrypt: key name %q appears twice", k.Name)
		}
		if len(k.Secret) != KeySize {
			return nil, fmt.Errorf("idemcrypt: key %q is %d bytes, want %d", k.Name, len(k.Secret), KeySize)
		}
		block, err := aes.NewCipher(k.Secret)
		if err != nil {
			return nil, fmt.Errorf("idemcrypt: key %q: %w", k.Name, err)
		}
		aead, err := cipher.NewGCM(block)
		if err != nil {
			return nil, fmt.Errorf("idemcrypt: key %q: %w", k.Name, err)
		}
		kr.aeads[k.Name] = aead
		kr.names = append(kr.names, k.Name)
	}
	kr.primary = kr.names[0]
	return kr, nil
}

func validName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("idemcrypt: a key name must be 1 to %d bytes long", maxNameLen)
	}
	for i := 0; i < len(name); i++ {
		switch c := name[i]; {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '.', c == '_', c == '-':
		default:
			return fmt.Errorf("idemcrypt: key name %q: only letters, digits, '.', '_' and '-' are allowed", name)
		}
	}
	return nil
}

// ParseKeyring parses a keys file: one key a line, NAME:BASE64 where BASE64
// is the standard encoding of KeySize random bytes (`openssl rand -base64
// 32`). Blank lines and lines starting with '#' are skipped; white space
// around a line is ignored. The first key seals, every key opens. Errors
// name the line, never its material.
func ParseKeyring(data []byte) (*Keyring, error) {
	var keys []Key
	sc := bufio.NewScanner(bytes.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, b64, ok := strings.Cut(line, ":")
		if !ok {
			return nil, fmt.Errorf("idemcrypt: keys line %d: want NAME:BASE64", n)
		}
		name, b64 = strings.TrimSpace(name), strings.TrimSpace(b64)
		if err := validName(name); err != nil {
			return nil, fmt.Errorf("idemcrypt: keys line %d: %s", n, strings.TrimPrefix(err.Error(), "idemcrypt: "))
		}
		secret, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return nil, fmt.Errorf("idemcrypt: keys line %d (key %q): the key is not valid standard base64", n, name)
		}
		if len(secret) != KeySize {
			return nil, fmt.Errorf("idemcrypt: keys line %d (key %q): the key is %d bytes, want %d", n, name, len(secret), KeySize)
		}
		keys = append(keys, Key{Name: name, Secret: secret})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("idemcrypt: reading keys: %w", err)
	}
	if len(keys) == 0 {
		return nil, errors.New("idemcrypt: the keys file holds no key")
	}
	kr, err := NewKeyring(keys...)
	for i := range keys {
		clear(keys[i].Secret)
	}
	return kr, err
}

// ErrKeysFileWritable is returned by LoadKeyring for a keys file that its
// group or other users may write: any of them could put a key of their own
// first, and every response would then be sealed under it.
var ErrKeysFileWritable = errors.New("idemcrypt: the keys file is writable by its group or by others (chmod go-w it)")

// LoadKeyring reads and parses the keys file at path (see ParseKeyring).
// On Unix it refuses, with ErrKeysFileWritable, a file that its group or
// other users may write (the file a symbolic link leads to is the one
// checked). A file others may read loads: ReadableByOthers tells, so that
// a command can warn.
func LoadKeyring(path string) (*Keyring, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("idemcrypt: reading the keys file: %w", err)
	}
	defer f.Close()
	// The mode of the file opened, not of the path looked up again.
	if fi, err := f.Stat(); err == nil && permissionBits && fi.Mode().Perm()&0o022 != 0 {
		return nil, fmt.Errorf("%s (mode %v): %w", path, fi.Mode().Perm(), ErrKeysFileWritable)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("idemcrypt: reading the keys file: %w", err)
	}
	defer clear(data)
	kr, err := ParseKeyring(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return kr, nil
}

// permissionBits reports whether file modes carry Unix permissions.
const permissionBits = runtime.GOOS != "windows" && runtime.GOOS != "plan9"

// ReadableByOthers reports whether users other than the file's owner and
// group may read the keys file at path (on Unix): the keys should be
// readable by the service's user only.
func ReadableByOthers(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && permissionBits && fi.Mode().Perm()&0o004 != 0
}

// Primary returns the name of the key that seals.
func (kr *Keyring) Primary() string { return kr.primary }

// Names returns the names of the keys, the sealing one first.
func (kr *Keyring) Names() []string { return append([]string(nil), kr.names...) }

// Has reports whether the keyring holds a key named name.
func (kr *Keyring) Has(name string) bool {
	_, ok := kr.aeads[name]
	return ok
}

// String returns the key names, never their material.
func (kr *Keyring) String() string {
	return "idemcrypt.Keyring[" + strings.Join(kr.names, ",") + "]"
}

// GoString is String, so %#v does not print the ciphers either.
func (kr *Keyring) GoString() string { return kr.String() }
