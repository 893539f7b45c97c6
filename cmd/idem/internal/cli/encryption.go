package cli

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemstore"
)

// keyringFlag is --encryption-keys-file: the path of the keys file, never
// key material (a flag value shows in ps); and, on the commands that
// replay stored responses, --encryption-required.
type keyringFlag struct {
	path     string
	required bool
}

func (k *keyringFlag) register(fs *flagSet) {
	fs.StringVar(&k.path, "encryption-keys-file", "",
		"`PATH` of a file of NAME:BASE64 lines (32 random bytes each, e.g. openssl rand -base64 32): stored responses are encrypted under the first key, opened with any")
}

// registerRequired adds --encryption-required, for the commands whose
// middleware replays stored responses (proxy, payments).
func (k *keyringFlag) registerRequired(fs *flagSet) {
	fs.BoolVar(&k.required, "encryption-required", false,
		"refuse to replay a stored response that is not encrypted (or encrypted before responses were bound to their request): 500 response-untrusted, and the request is never run again; turn on once keys rotate-encryption has sealed every record")
}

// check refuses --encryption-required without a keys file.
func (k *keyringFlag) check() error {
	if k.required && k.path == "" {
		return usageErrorf("--encryption-required (or %s) needs --encryption-keys-file (or %s)", envName("encryption-required"), envName("encryption-keys-file"))
	}
	return nil
}

// load returns the keyring, or nil without the flag. A keys file others
// may write is refused (idemcrypt.LoadKeyring); one others may read loads
// with a warning.
func (k *keyringFlag) load(e *env) (*idemcrypt.Keyring, error) {
	if k.path == "" {
		return nil, nil
	}
	kr, err := idemcrypt.LoadKeyring(k.path)
	if err != nil {
		return nil, usageErrorf("--encryption-keys-file (or %s): %v", envName("encryption-keys-file"), err)
	}
	if idemcrypt.ReadableByOthers(k.path) {
		e.logger.Warn("the encryption keys file is readable by other users: make it readable by the service's user only (chmod o-r)",
			"keys_file", k.path)
	}
	return kr, nil
}

// fieldsValue is a comma-separated list of dotted JSON member paths.
type fieldsValue struct{ p *[]string }

func (v fieldsValue) String() string {
	if v.p == nil {
		return ""
	}
	return strings.Join(*v.p, ",")
}

func (v fieldsValue) Set(s string) error {
	var out []string
	for f := range strings.SplitSeq(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" || strings.HasPrefix(f, ".") || strings.HasSuffix(f, ".") || strings.Contains(f, "..") {
			return fmt.Errorf("%q is not a member path such as token or card.number", f)
		}
		out = append(out, f)
	}
	*v.p = out
	return nil
}

// keysRotateOptions are the settings of `idem keys rotate-encryption`.
type keysRotateOptions struct {
	store     string
	keyring   keyringFlag
	batchSize int
	resume    *idemstore.Identity
}

func parseKeysRotate(args []string, e *env) (*keysRotateOptions, error) {
	o := &keysRotateOptions{store: storeurl.Default, batchSize: idemcrypt.DefaultRotateBatch}
	fs := newFlagSet("keys rotate-encryption", "idem keys rotate-encryption --encryption-keys-file PATH [--store URL] [--batch-size N] [--resume CURSOR]",
		"Re-encrypts every completed record's stored response under the first key of\n"+
			"the keys file (responses stored in the clear are encrypted), in batches, with a\n"+
			"progress line per batch. It passes over the records again until a whole pass\n"+
			"finds nothing left to re-encrypt (at most 10 passes): a process still sealing\n"+
			"under an old key would otherwise leave records behind. Keep the old keys in\n"+
			"every process's keys file until it reports nothing left under them.\n"+
			"Interrupted, it resumes from the cursor it printed last (--resume), or from\n"+
			"the start: records done are skipped.")
	fs.Var(storeValue{&o.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	o.keyring.register(fs)
	fs.Var(positiveIntValue{&o.batchSize}, "batch-size", "`N` records listed and rewritten per batch")
	fs.Var(cursorValue{&o.resume}, "resume", "`CURSOR` printed by an interrupted run: start after it")
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	if o.keyring.path == "" {
		return nil, usageErrorf("--encryption-keys-file (or %s) is required", envName("encryption-keys-file"))
	}
	return o, nil
}

// cursorValue is a rotation cursor: the base64url JSON of an identity.
type cursorValue struct{ p **idemstore.Identity }

func (v cursorValue) String() string { return "" }

func (v cursorValue) Set(s string) error {
	b, err := base64.RawURLEncoding.DecodeString(s)
	var id idemstore.Identity
	if err == nil {
		err = json.Unmarshal(b, &id)
	}
	if err != nil || id.Endpoint == "" {
		return errors.New("not a cursor printed by rotate-encryption")
	}
	*v.p = &id
	return nil
}

func encodeCursor(id *idemstore.Identity) string {
	if id == nil {
		return "-"
	}
	b, _ := json.Marshal(id)
	return base64.RawURLEncoding.EncodeToString(b)
}

func runKeysRotate(ctx context.Context, e *env, args []string, open storeOpener) (err error) {
	o, err := parseKeysRotate(args, e)
	if err != nil {
		return err
	}
	kr, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	store, closeStore, err := openStore(ctx, open, o.store)
	if err != nil {
		return err
	}
	defer closeStore(&err)
	fmt.Fprintf(e.stdout, "Re-encrypting stored responses under key %q (keys: %s), %d records a batch.\n",
		kr.Primary(), strings.Join(kr.Names(), ", "), o.batchSize)
	prog, err := idemcrypt.Rotate(ctx, store, kr, &idemcrypt.RotateConfig{
		Batch: o.batchSize,
		After: o.resume,
		Progress: func(p idemcrypt.RotateProgress) {
			fmt.Fprintf(e.stdout, "pass %d  scanned %d  re-encrypted %d  already current %d  changed meanwhile %d  unopenable %d  cursor %s\n",
				p.Passes, p.Scanned, p.Resealed, p.Current, p.Gone, p.Failed(), encodeCursor(p.Cursor))
		},
	})
	e.logger.Info("idem keys: encryption rotated", "action", "rotate-encryption", "key", kr.Primary(),
		"scanned", prog.Scanned, "resealed", prog.Resealed, "unopenable", prog.Failed(), "operator", operator(e))
	if errors.Is(err, idemcrypt.ErrRotationUnsettled) {
		return fmt.Errorf("%d passes re-encrypted %d records and the last still found records under another key: "+
			"a process is still storing responses under an old key (is one still running with an old keys file?); "+
			"deploy the new keys file everywhere, then run rotate-encryption again", prog.Passes, prog.Resealed)
	}
	if err != nil {
		return fmt.Errorf("rotation stopped (resume with --resume %s): %w", encodeCursor(prog.Cursor), err)
	}
	fmt.Fprintf(e.stdout, "Done in %d passes (the last found nothing left to re-encrypt): %d records scanned, %d re-encrypted under %q, %d already current, %d changed meanwhile.\n",
		prog.Passes, prog.Scanned, prog.Resealed, kr.Primary(), prog.Current, prog.Gone)
	if n := prog.Failed(); n > 0 {
		return fmt.Errorf("%d records could not be opened, sealed under keys missing from the keys file (or not matching it): %s; "+
			"they answer 503 until that key is back (or until they expire)", n, strings.Join(prog.FailedKeys(), ", "))
	}
	return nil
}

// keyNames is the log attribute of a keyring: its key names, "none"
// without one.
func keyNames(kr *idemcrypt.Keyring) string {
	if kr == nil {
		return "none"
	}
	return strings.Join(kr.Names(), ",")
}
