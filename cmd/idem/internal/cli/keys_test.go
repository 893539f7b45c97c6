package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/idemtest"
	"github.com/idem-dev/idem/internal/testenv"
)

func TestParseKeysList(t *testing.T) {
	t.Parallel()
	def := keysListOptions{store: "sqlite:./idem.db", limit: 100}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(o *keysListOptions)
		wantErr string
	}{
		{name: "defaults", want: func(*keysListOptions) {}},
		{name: "every flag",
			args: []string{"--store", "memory:", "--state", "unknown", "--tenant", "acme", "--endpoint", "POST /v1/payments",
				"--older-than", "1h", "--limit", "5", "--json"},
			want: func(o *keysListOptions) {
				o.store, o.state, o.scope, o.endpoint, o.olderThan, o.limit, o.json = "memory:", "unknown", "acme", "POST /v1/payments", time.Hour, 5, true
			}},
		{name: "every variable",
			env: map[string]string{"IDEM_STORE": "memory:", "IDEM_STATE": "completed", "IDEM_TENANT": "acme", "IDEM_ENDPOINT": "PATCH /x",
				"IDEM_OLDER_THAN": "2m", "IDEM_LIMIT": "0", "IDEM_JSON": "true"},
			want: func(o *keysListOptions) {
				o.store, o.state, o.scope, o.endpoint, o.olderThan, o.limit, o.json = "memory:", "completed", "acme", "PATCH /x", 2*time.Minute, 0, true
			}},
		{name: "flag wins over variable", args: []string{"--state", "released"}, env: map[string]string{"IDEM_STATE": "unknown"},
			want: func(o *keysListOptions) { o.state = "released" }},
		{name: "tenant header value is hashed as the proxy does", args: []string{"--tenant-header-value", "Bearer t-1"},
			want: func(o *keysListOptions) { o.scope = scopeOf("Bearer t-1") }},
		{name: "tenant header value from the variable", env: map[string]string{"IDEM_TENANT_HEADER_VALUE": "Bearer t-1"},
			want: func(o *keysListOptions) { o.scope = scopeOf("Bearer t-1") }},

		{name: "key", args: []string{"--key", "order-1001"}, want: func(o *keysListOptions) { o.key = "order-1001" }},
		{name: "prefix from the variable", env: map[string]string{"IDEM_PREFIX": "order-"}, want: func(o *keysListOptions) { o.prefix = "order-" }},
		{name: "key and prefix", args: []string{"--key", "a", "--prefix", "b"}, wantErr: "give --key or --prefix, not both"},
		{name: "tenant twice", args: []string{"--tenant", "a", "--tenant-header-value", "b"}, wantErr: "not both"},
		{name: "bad state", args: []string{"--state", "done"}, wantErr: "want in_progress, completed, released or unknown"},
		{name: "bad state variable", env: map[string]string{"IDEM_STATE": "done"}, wantErr: `invalid value "done" for IDEM_STATE`},
		{name: "bad older-than", args: []string{"--older-than", "3"}, wantErr: "want a Go duration"},
		{name: "negative limit", args: []string{"--limit", "-1"}, wantErr: "want a number, 0 or more"},
		{name: "positional", args: []string{"k"}, wantErr: `unexpected argument "k"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseKeysList(tt.args, newTestEnv(tt.env).env)
			if tt.wantErr != "" {
				var uerr usageError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &uerr) {
					t.Fatalf("error = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			want := def
			tt.want(&want)
			if !reflect.DeepEqual(*o, want) {
				t.Errorf("options = %+v, want %+v", *o, want)
			}
		})
	}
}

func TestParseKeysRecordCommands(t *testing.T) {
	t.Parallel()
	id := idemstore.Identity{Scope: "acme", Endpoint: "POST /v1/payments", Key: "k-1"}
	tests := []struct {
		name    string
		parse   func(args []string, e *env) (idemstore.Identity, error)
		args    []string
		env     map[string]string
		want    idemstore.Identity
		wantErr string
	}{
		{name: "show, key last", parse: showIdentity, args: []string{"--tenant", "acme", "--endpoint", "POST /v1/payments", "k-1"}, want: id},
		{name: "show, key first", parse: showIdentity, args: []string{"k-1", "--tenant", "acme", "--endpoint", "POST /v1/payments"}, want: id},
		{name: "show, key after --", parse: showIdentity, args: []string{"--endpoint", "POST /x", "--", "-k"}, want: idemstore.Identity{Endpoint: "POST /x", Key: "-k"}},
		{name: "show, variables", parse: showIdentity, args: []string{"k-1"}, env: map[string]string{"IDEM_TENANT": "acme", "IDEM_ENDPOINT": "POST /v1/payments"}, want: id},
		{name: "show, header value", parse: showIdentity, args: []string{"--tenant-header-value", "t", "--endpoint", "POST /x", "k"},
			want: idemstore.Identity{Scope: scopeOf("t"), Endpoint: "POST /x", Key: "k"}},
		{name: "show, no key", parse: showIdentity, args: []string{"--endpoint", "POST /x"}, wantErr: "want the KEY"},
		{name: "show, two keys", parse: showIdentity, args: []string{"--endpoint", "POST /x", "a", "b"}, wantErr: `unexpected argument "b"`},
		{name: "show, no endpoint", parse: showIdentity, args: []string{"k"}, wantErr: "--endpoint (or IDEM_ENDPOINT) is required"},
		{name: "show, empty key", parse: showIdentity, args: []string{"--endpoint", "POST /x", ""}, wantErr: "the key is empty"},

		{name: "resolve released", parse: resolveIdentity, args: []string{"--tenant", "acme", "--endpoint", "POST /v1/payments", "--to", "released", "k-1"}, want: id},
		{name: "resolve completed", parse: resolveIdentity, args: []string{"--tenant", "acme", "--endpoint", "POST /v1/payments", "--to", "completed",
			"--status", "201", "--body", "x", "--header", "content-type: text/plain", "--header", "Location: /p/1", "k-1"}, want: id},
		{name: "resolve not replayable", parse: resolveIdentity, args: []string{"--tenant", "acme", "--endpoint", "POST /v1/payments", "--to", "completed", "--not-replayable", "k-1"}, want: id},
		{name: "resolve without --to", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "k"}, wantErr: "--to completed or --to released is required"},
		{name: "resolve to unknown", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "unknown", "k"}, wantErr: "want one of completed, released"},
		{name: "resolve completed without status", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "completed", "k"}, wantErr: "needs --status"},
		{name: "resolve bad status", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "completed", "--status", "600", "k"}, wantErr: "needs --status between 100 and 599"},
		{name: "resolve released with body", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "released", "--body", "x", "k"}, wantErr: "go with --to completed"},
		{name: "resolve not replayable with status", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "completed", "--not-replayable", "--status", "200", "k"}, wantErr: "stores no response"},
		{name: "resolve bad header", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "completed", "--status", "200", "--header", "nocolon", "k"}, wantErr: `want "Name: value"`},
		{name: "resolve header not replayed", parse: resolveIdentity, args: []string{"--endpoint", "POST /x", "--to", "completed", "--status", "200", "--header", "Set-Cookie: a=b", "k"}, wantErr: "Set-Cookie is not replayed"},

		{name: "purge one", parse: purgeIdentity, args: []string{"--tenant", "acme", "--endpoint", "POST /v1/payments", "--key", "k-1"}, want: id},
		{name: "purge one from variables", parse: purgeIdentity, env: map[string]string{"IDEM_KEY": "k-1", "IDEM_TENANT": "acme", "IDEM_ENDPOINT": "POST /v1/payments"}, want: id},
		{name: "purge expired", parse: purgeIdentity, want: idemstore.Identity{}},
		{name: "purge endpoint without key", parse: purgeIdentity, args: []string{"--endpoint", "POST /x"}, wantErr: "give its --key too"},
		{name: "purge key without endpoint", parse: purgeIdentity, args: []string{"--key", "k"}, wantErr: "--endpoint (or IDEM_ENDPOINT) is required"},
		{name: "purge batch zero", parse: purgeIdentity, args: []string{"--batch-size", "0"}, wantErr: "--batch-size must be positive"},
		{name: "purge positional", parse: purgeIdentity, args: []string{"k"}, wantErr: `unexpected argument "k"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := tt.parse(tt.args, newTestEnv(tt.env).env)
			if tt.wantErr != "" {
				var uerr usageError
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !errors.As(err, &uerr) {
					t.Fatalf("error = %v, want a usage error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tt.want {
				t.Errorf("identity = %+v, want %+v", got, tt.want)
			}
		})
	}
}

func showIdentity(args []string, e *env) (idemstore.Identity, error) {
	_, id, err := parseKeysShow(args, e)
	return id, err
}

func resolveIdentity(args []string, e *env) (idemstore.Identity, error) {
	_, id, err := parseKeysResolve(args, e)
	return id, err
}

func purgeIdentity(args []string, e *env) (idemstore.Identity, error) {
	_, id, err := parseKeysPurge(args, e)
	if id == nil {
		return idemstore.Identity{}, err
	}
	return *id, err
}

func TestKeysUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{[]string{"keys"}, ExitUsage, "", "want a subcommand: list, show, resolve, purge or rotate-encryption"},
		{[]string{"keys", "-h"}, ExitOK, "Usage: idem keys list|show|resolve|purge", ""},
		{[]string{"help", "keys"}, ExitOK, "  resolve  settle an unknown record", ""},
		{[]string{"keys", "nope"}, ExitUsage, "", `unknown subcommand "nope"`},
		{[]string{"keys", "list", "-h"}, ExitOK, "--tenant-header-value VALUE  (IDEM_TENANT_HEADER_VALUE)", ""},
		{[]string{"keys", "resolve", "--help"}, ExitOK, "Usage: idem keys resolve --endpoint ENDPOINT", ""},
		{[]string{"keys", "purge", "-h"}, ExitOK, "--key KEY  (IDEM_KEY)", ""},
		{[]string{"keys", "show", "--endpoint", "POST /x"}, ExitUsage, "", "idem keys: want the KEY\nRun 'idem keys --help' for usage."},
		{[]string{"keys", "list", "--store", "sqlite:" + filepath.Join(t.TempDir(), "typo.db")}, ExitError, "", "idem keys: opening the store: store sqlite:"},
	}
	for _, tt := range tests {
		code, stdout, stderr := runCommand(t, nil, tt.args...)
		if code != tt.wantCode || !strings.Contains(stdout, tt.wantStdout) || !strings.Contains(stderr, tt.wantStderr) {
			t.Errorf("idem %s: exit %d\nstdout: %s\nstderr: %s\nwant exit %d, stdout with %q, stderr with %q",
				strings.Join(tt.args, " "), code, stdout, stderr, tt.wantCode, tt.wantStdout, tt.wantStderr)
		}
	}
}

// keysBackend is a store the keys tests seed and run `idem keys` against.
type keysBackend struct {
	name  string
	url   string
	store idemstore.Store
	// open is how the command opens the store: the URL, or the seeded
	// memory store itself.
	open storeOpener
}

// keysBackends are the stores of the keys tests: memory, SQLite,
// PostgreSQL, Redis and a private Redis Cluster (skipped when absent), by
// name.
var keysBackends = []struct {
	name string
	new  func(t *testing.T) *keysBackend
}{
	{"memory", func(t *testing.T) *keysBackend {
		s := idemmem.New(nil)
		return &keysBackend{name: "memory", url: "memory:", store: s, open: sharedOpener(s)}
	}},
	{"sqlite", func(t *testing.T) *keysBackend {
		b := urlBackend(t, "sqlite", sqliteURL(t))
		b.open = openExisting // as runKeys does
		return b
	}},
	{"postgres", func(t *testing.T) *keysBackend { return urlBackend(t, "postgres", postgresURL(t)) }},
	{"mysql", func(t *testing.T) *keysBackend { return urlBackend(t, "mysql", mysqlURL(t)) }},
	{"redis", func(t *testing.T) *keysBackend { return urlBackend(t, "redis", redisURL(t)) }},
	{"redis-cluster", func(t *testing.T) *keysBackend {
		u, _ := redisClusterURL(t)
		return urlBackend(t, "redis-cluster", u)
	}},
}

// redisURL is the URL of the test Redis with a key prefix of the test's
// own, whose keys are deleted when the test ends.
func redisURL(t *testing.T) string {
	t.Helper()
	base := testenv.RedisURL(t)
	b := make([]byte, 6)
	rand.Read(b)
	prefix := "cli_test_" + hex.EncodeToString(b) + ":"
	t.Cleanup(func() {
		opts, err := redis.ParseURL(base)
		if err != nil {
			t.Error(err)
			return
		}
		client := redis.NewClient(opts)
		defer client.Close()
		ctx := context.Background()
		iter := client.Scan(ctx, 0, prefix+"*", 1000).Iterator()
		var keys []string
		for iter.Next(ctx) {
			keys = append(keys, iter.Val())
		}
		if err := iter.Err(); err != nil {
			t.Errorf("listing the test's keys: %v", err)
		}
		if len(keys) > 0 {
			if err := client.Del(ctx, keys...).Err(); err != nil {
				t.Errorf("deleting the test's keys: %v", err)
			}
		}
	})
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	q := u.Query()
	q.Set("prefix", prefix)
	u.RawQuery = q.Encode()
	return u.String()
}

func urlBackend(t *testing.T, name, u string) *keysBackend {
	t.Helper()
	s, closeStore, err := storeurl.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { closeStore() })
	return &keysBackend{name: name, url: u, store: s, open: storeurl.Open}
}

// sharedOpener opens s whatever the URL, and does not close it.
func sharedOpener(s idemstore.Store) storeOpener {
	return func(context.Context, string) (idemstore.Store, func() error, error) {
		return s, func() error { return nil }, nil
	}
}

// keys runs `idem keys ARGS --store URL` in process, as run does, with the
// environment variables vars.
func (b *keysBackend) keys(t *testing.T, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	return runKeysIn(t, b.open, vars, append(args, "--store", b.url)...)
}

// runKeysIn runs `idem keys ARGS` with the store opener, mapping its error
// to the exit code and stderr as run does.
func runKeysIn(t *testing.T, open storeOpener, vars map[string]string, args ...string) (int, string, string) {
	t.Helper()
	e := newTestEnv(vars)
	err := keysMain(t.Context(), e.env, args, open)
	var uerr usageError
	code := ExitOK
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
	case errors.As(err, &uerr):
		code = ExitUsage
		fmt.Fprintf(e.stderr, "idem keys: %v\n", err)
	default:
		code = ExitError
		fmt.Fprintf(e.stderr, "idem keys: %v\n", err)
	}
	return code, e.stdout.String(), e.stderr.String()
}

// seed stores a record in state, with the store's fenced operations.
func seed(t *testing.T, s idemstore.Store, id idemstore.Identity, state idemstore.State, ttl time.Duration) {
	t.Helper()
	ctx := t.Context()
	token := "seed-" + id.Key
	res, err := s.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "fp-" + id.Key, Token: token,
		Lease: time.Hour, TTL: ttl, LeaseExpiredState: idemstore.StateUnknown})
	if err != nil || !res.Reserved {
		t.Fatalf("reserving %s: %+v, %v", id.Key, res, err)
	}
	p := &idemstore.FinishParams{Identity: id, Token: token}
	switch state {
	case idemstore.StateCompleted:
		err = s.KeyComplete(ctx, &idemstore.CompleteParams{Identity: id, Token: token, Response: &idemstore.Response{
			Status: http.StatusCreated, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_1"}`)}})
	case idemstore.StateReleased:
		err = s.KeyRelease(ctx, p)
	case idemstore.StateUnknown:
		err = s.KeyMarkUnknown(ctx, p)
	}
	if err != nil {
		t.Fatalf("seeding %s as %s: %v", id.Key, state, err)
	}
}

const payments = "POST /v1/payments"

func TestKeysCommands(t *testing.T) {
	t.Parallel()
	for _, kb := range keysBackends {
		t.Run(kb.name, func(t *testing.T) {
			t.Parallel()
			b := kb.new(t)
			acme := scopeOf("Bearer acme")
			id := func(key string) idemstore.Identity {
				return idemstore.Identity{Scope: acme, Endpoint: payments, Key: key}
			}
			seed(t, b.store, id("k-completed"), idemstore.StateCompleted, time.Hour)
			seed(t, b.store, id("k-released"), idemstore.StateReleased, time.Hour)
			seed(t, b.store, id("k-unknown"), idemstore.StateUnknown, time.Hour)
			seed(t, b.store, id("k-progress"), idemstore.StateInProgress, time.Hour)
			seed(t, b.store, id("k-expired"), idemstore.StateInProgress, 0)
			seed(t, b.store, idemstore.Identity{Scope: "globex", Endpoint: payments, Key: "k-other"}, idemstore.StateCompleted, time.Hour)
			testKeysList(t, b, acme)
			testKeysShow(t, b, acme)
			testKeysResolve(t, b, acme)
			testKeysPurge(t, b, acme)
		})
	}
}

func testKeysList(t *testing.T, b *keysBackend, acme string) {
	mustKeys := func(args ...string) string {
		t.Helper()
		code, stdout, stderr := b.keys(t, nil, args...)
		if code != ExitOK {
			t.Fatalf("idem keys %s: exit %d, stderr %s", strings.Join(args, " "), code, stderr)
		}
		return stdout
	}
	out := mustKeys("list")
	rows := strings.Split(strings.TrimSpace(out), "\n")
	if len(rows) != 6 || !regexp.MustCompile(`^TENANT\s+ENDPOINT\s+KEY\s+STATE\s+ATTEMPTS\s+AGE\s+EXPIRES$`).MatchString(rows[0]) {
		t.Fatalf("list printed\n%s\nwant a header and 5 live records", out)
	}
	row := regexp.MustCompile(`(?m)^` + acme + `\s+POST /v1/payments\s+k-completed\s+completed\s+1\s+\d+s\s+in (59m\d+s|1h0m0s)$`)
	if !row.MatchString(out) {
		t.Errorf("list lacks the completed record's row:\n%s", out)
	}
	if strings.Contains(out, "k-expired") {
		t.Errorf("list shows an expired record:\n%s", out)
	}
	// Filters.
	if out := mustKeys("list", "--state", "unknown"); !strings.Contains(out, "k-unknown") || strings.Count(out, "\n") != 2 {
		t.Errorf("list --state unknown:\n%s", out)
	}
	if out := mustKeys("list", "--tenant", "globex"); !strings.Contains(out, "k-other") || strings.Count(out, "\n") != 2 {
		t.Errorf("list --tenant globex:\n%s", out)
	}
	if out := mustKeys("list", "--tenant-header-value", "Bearer acme"); strings.Contains(out, "k-other") || strings.Count(out, "\n") != 5 {
		t.Errorf("list --tenant-header-value:\n%s", out)
	}
	if out := mustKeys("list", "--endpoint", "POST /other"); out != "No records.\n" {
		t.Errorf("list --endpoint with no record printed %q", out)
	}
	if out := mustKeys("list", "--older-than", "1h"); out != "No records.\n" {
		t.Errorf("list --older-than 1h printed %q", out)
	}
	if out := mustKeys("list", "--older-than", "1ns", "--state", "released"); !strings.Contains(out, "k-released") {
		t.Errorf("list --older-than 1ns printed %q", out)
	}
	code, out, stderr := b.keys(t, nil, "list", "--limit", "2")
	if code != ExitOK || strings.Count(out, "\n") != 3 || !strings.Contains(stderr, "3 more records match: raise --limit (now 2)") {
		t.Errorf("list --limit 2: exit %d\n%s\nstderr %s", code, out, stderr)
	}
	code, out, stderr = b.keys(t, nil, "list", "--limit", "5")
	// (A Redis Cluster adds a line saying every master was read.)
	if code != ExitOK || strings.Count(out, "\n") != 6 || strings.Contains(stderr, "More records match") {
		t.Errorf("list --limit 5 (all of them): exit %d\n%s\nstderr %s", code, out, stderr)
	}
	// JSON lines.
	out = mustKeys("list", "--json", "--tenant", acme)
	var states []string
	for line := range strings.Lines(out) {
		var j jsonRecord
		if err := json.Unmarshal([]byte(line), &j); err != nil {
			t.Fatalf("list --json line %q: %v", line, err)
		}
		if j.Scope != acme || j.Endpoint != payments || j.KeyHash != j.identity().LogHash() || j.ExpiresAt.IsZero() {
			t.Errorf("list --json line %q", line)
		}
		if (j.State == idemstore.StateInProgress) != (j.LockedUntil != nil) || (j.State == idemstore.StateCompleted) != (j.ResponseStatus == 201) {
			t.Errorf("list --json line %q: locked_until or response_status wrong for its state", line)
		}
		states = append(states, j.Key+"="+string(j.State))
	}
	slices.Sort(states) // newest first: seeded within a clock tick of each other
	want := []string{"k-completed=completed", "k-progress=in_progress", "k-released=released", "k-unknown=unknown"}
	if !reflect.DeepEqual(states, want) {
		t.Errorf("list --json records = %v, want %v", states, want)
	}
	if strings.Contains(out, "seed-") {
		t.Errorf("list --json shows fencing tokens:\n%s", out)
	}
}

func (j jsonRecord) identity() idemstore.Identity {
	return idemstore.Identity{Scope: j.Scope, Endpoint: j.Endpoint, Key: j.Key}
}

func testKeysShow(t *testing.T, b *keysBackend, acme string) {
	code, out, stderr := b.keys(t, nil, "show", "--tenant-header-value", "Bearer acme", "--endpoint", payments, "k-completed")
	if code != ExitOK {
		t.Fatalf("show: exit %d, stderr %s", code, stderr)
	}
	for _, want := range []string{
		"key:               k-completed\n",
		"tenant:            " + acme + "\n",
		"state:             completed\n",
		"attempts:          1\n",
		"fingerprint:       fp-k-completed\n",
		"lease expires to:  unknown\n",
		"response:          201 Created\n",
		"  Content-Type: application/json\nbody: 14 bytes\n  {\"id\":\"pay_1\"}\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("show lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^expires:\s+\S+Z \(in (59m\d+s|1h0m0s)\)$`).MatchString(out) {
		t.Errorf("show lacks the expiry:\n%s", out)
	}
	code, out, _ = b.keys(t, nil, "show", "--tenant", acme, "--endpoint", payments, "--json", "k-completed")
	var j jsonRecord
	if err := json.Unmarshal([]byte(out), &j); code != ExitOK || err != nil || j.Response == nil ||
		string(j.Response.BodyBase64) != `{"id":"pay_1"}` || j.Response.Header.Get("Content-Type") != "application/json" {
		t.Errorf("show --json: exit %d, %q (%v)", code, out, err)
	}
	// An unknown record shows that it never expires and its reconciliation
	// state.
	unk := idemstore.Identity{Scope: acme, Endpoint: payments, Key: "k-show-unknown"}
	seed(t, b.store, unk, idemstore.StateUnknown, time.Hour)
	rec, err := b.store.KeyGet(t.Context(), unk)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.store.KeyReconcileFail(t.Context(), &idemstore.ReconcileFailParams{Identity: unk, Token: rec.Token, Error: "upstream answered 503", Delay: time.Hour}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = b.keys(t, nil, "show", "--tenant", acme, "--endpoint", payments, "k-show-unknown")
	for _, want := range []string{"state:               unknown\n", "never while unknown", "reconcile attempts:  1\n", "reconcile error:     upstream answered 503\n"} {
		if code != ExitOK || !strings.Contains(out, want) {
			t.Errorf("show of an unknown record lacks %q:\n%s", want, out)
		}
	}
	if !regexp.MustCompile(`(?m)^next reconcile:\s+\S+Z \(in (59m\d+s|1h0m0s)\)$`).MatchString(out) {
		t.Errorf("show lacks the next reconcile time:\n%s", out)
	}
	code, out, _ = b.keys(t, nil, "show", "--tenant", acme, "--endpoint", payments, "--json", "k-show-unknown")
	if err := json.Unmarshal([]byte(out), &j); code != ExitOK || err != nil || j.ReconcileAttempts != 1 || j.ReconcileError != "upstream answered 503" || j.ReconcileAfter == nil {
		t.Errorf("show --json of an unknown record: exit %d, %q (%v)", code, out, err)
	}
	if _, err := b.store.KeyPurge(t.Context(), &idemstore.PurgeParams{Identity: unk, Force: true}); err != nil {
		t.Fatal(err)
	}
	code, out, _ = b.keys(t, nil, "show", "--tenant", acme, "--endpoint", payments, "k-progress")
	if code != ExitOK || !regexp.MustCompile(`(?m)^locked until:\s+\S+Z \(in `).MatchString(out) || !strings.Contains(out, "response:          none\n") {
		t.Errorf("show of an in_progress record: exit %d\n%s", code, out)
	}
	// The same key in another tenant is another record.
	code, _, stderr = b.keys(t, nil, "show", "--tenant", "globex", "--endpoint", payments, "k-completed")
	if code != ExitError || !strings.Contains(stderr, `no record with key k-completed on "POST /v1/payments" in tenant "globex"`) {
		t.Errorf("show of a missing record: exit %d, stderr %s", code, stderr)
	}
}

func testKeysResolve(t *testing.T, b *keysBackend, acme string) {
	ctx := t.Context()
	bodyFile := filepath.Join(t.TempDir(), "body.json")
	if err := os.WriteFile(bodyFile, []byte(`{"id":"pay_9","status":"succeeded"}`), 0o600); err != nil {
		t.Fatal(err)
	}
	vars := map[string]string{"USER": "alice"}
	id := idemstore.Identity{Scope: acme, Endpoint: payments, Key: "k-unknown"}
	code, out, stderr := b.keys(t, vars, "resolve", "--tenant", acme, "--endpoint", payments, "k-unknown",
		"--to", "completed", "--status", "201", "--body", "@"+bodyFile, "--header", "Content-Type: application/json")
	if code != ExitOK || out != "Resolved k-unknown to completed: retries get 201 with the 35-byte body.\n" {
		t.Fatalf("resolve: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	audit := regexp.MustCompile(`level=INFO msg="idem keys: record resolved" action=resolve key_hash=` + id.LogHash() +
		` endpoint="POST /v1/payments" scope=` + acme + ` from=unknown to=completed operator=alice status=201\n`)
	if !audit.MatchString(stderr) {
		t.Errorf("resolve's audit line is missing or wrong:\n%s", stderr)
	}
	if strings.Contains(stderr, "k-unknown") {
		t.Errorf("the audit line names the key:\n%s", stderr)
	}
	rec, err := b.store.KeyGet(ctx, id)
	if err != nil || rec.State != idemstore.StateCompleted || rec.Response == nil || rec.Response.Status != 201 ||
		string(rec.Response.Body) != `{"id":"pay_9","status":"succeeded"}` || rec.Response.Header.Get("Content-Type") != "application/json" {
		t.Errorf("record after resolve = %+v, %v", rec, err)
	}
	// Only unknown records are resolved.
	code, _, stderr = b.keys(t, vars, "resolve", "--tenant", acme, "--endpoint", payments, "k-unknown", "--to", "released")
	if code != ExitError || !strings.Contains(stderr, "the record is completed, not unknown") {
		t.Errorf("resolving a completed record: exit %d, stderr %s", code, stderr)
	}
	// To released, then a retry may execute it: the store lets a reservation
	// take it over.
	id2 := idemstore.Identity{Scope: "globex", Endpoint: payments, Key: "k-unknown-2"}
	seed(t, b.store, id2, idemstore.StateUnknown, time.Hour)
	code, out, stderr = b.keys(t, nil, "resolve", "--tenant", "globex", "--endpoint", payments, "--to", "released", "k-unknown-2")
	if code != ExitOK || out != "Resolved k-unknown-2 to released: the next retry executes it.\n" || !strings.Contains(stderr, "from=unknown to=released operator=unknown") {
		t.Errorf("resolve --to released: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	res, err := b.store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id2, Fingerprint: "fp-k-unknown-2", Token: "retry", Lease: time.Hour, TTL: time.Hour})
	if err != nil || !res.Reserved || res.Record.Attempts != 2 {
		t.Errorf("retry after resolving to released = %+v, %v; want it reserved, attempt 2", res, err)
	}
}

func testKeysPurge(t *testing.T, b *keysBackend, acme string) {
	ctx := t.Context()
	vars := map[string]string{"USER": "bob"}
	purge := func(key string) (int, string, string) {
		return b.keys(t, vars, "purge", "--tenant", acme, "--endpoint", payments, "--key", key)
	}
	id := idemstore.Identity{Scope: acme, Endpoint: payments, Key: "k-released"}
	code, out, stderr := purge("k-released")
	if code != ExitOK || out != "Purged k-released: the key may be used again.\n" ||
		!strings.Contains(stderr, `msg="idem keys: record purged" action=purge key_hash=`+id.LogHash()) ||
		!strings.Contains(stderr, "from=released to=deleted force=false operator=bob") {
		t.Fatalf("purge --key: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	if _, err := b.store.KeyGet(ctx, id); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("KeyGet after purge = %v, want ErrNotFound", err)
	}
	// The key takes another request now: no 422 key-reused.
	if res, err := b.store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: id, Fingerprint: "another body", Token: "t", Lease: time.Hour, TTL: time.Hour}); err != nil || !res.Reserved || res.Record.Attempts != 1 {
		t.Errorf("a new request on the purged key = %+v, %v; want a new record", res, err)
	}
	for _, tt := range []struct{ key, want string }{
		{"k-completed", "the record with key k-completed on \"POST /v1/payments\" in tenant \"" + acme + "\" is completed: it is kept until its retention ends at"},
		{"k-progress", "is in_progress: an attempt holds its lease"},
		{"k-released", "is in_progress"}, // the new request above
		{"missing", "no record with key missing"},
	} {
		if code, _, stderr := purge(tt.key); code != ExitError || !strings.Contains(stderr, tt.want) || !strings.Contains(stderr, "--force") && tt.key != "missing" {
			t.Errorf("purge --key %s: exit %d, stderr %s; want 1 and %q", tt.key, code, stderr, tt.want)
		}
	}
	// An unknown record: refused without --force, named; deleted with it,
	// with a warning audit line.
	unknownID := idemstore.Identity{Scope: acme, Endpoint: payments, Key: "k-unknown-3"}
	seed(t, b.store, unknownID, idemstore.StateUnknown, time.Hour)
	if code, _, stderr := purge("k-unknown-3"); code != ExitError ||
		!strings.Contains(stderr, `the record with key k-unknown-3 on "POST /v1/payments" in tenant "`+acme+`" is unknown`) ||
		!strings.Contains(stderr, "settle it first with 'idem keys resolve") || !strings.Contains(stderr, "--force") {
		t.Errorf("purge of an unknown record: exit %d, stderr %s", code, stderr)
	}
	if _, err := b.store.KeyGet(ctx, unknownID); err != nil {
		t.Fatalf("the unknown record after a refused purge: %v", err)
	}
	code, out, stderr = b.keys(t, vars, "purge", "--tenant", acme, "--endpoint", payments, "--key", "k-unknown-3", "--force")
	if code != ExitOK || out != "Purged k-unknown-3, which was unknown: the next request with the key executes again.\n" ||
		!strings.Contains(stderr, `level=WARN msg="idem keys: record purged" action=purge key_hash=`+unknownID.LogHash()) ||
		!strings.Contains(stderr, "from=unknown to=deleted force=true operator=bob") || strings.Contains(stderr, "k-unknown-3") {
		t.Fatalf("purge --force of an unknown record: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	if _, err := b.store.KeyGet(ctx, unknownID); !errors.Is(err, idemstore.ErrNotFound) {
		t.Errorf("KeyGet after purge --force = %v, want ErrNotFound", err)
	}
	if code, _, stderr := b.keys(t, vars, "purge", "--force"); code != ExitUsage || !strings.Contains(stderr, "--force goes with --key") {
		t.Errorf("purge --force without --key: exit %d, stderr %s", code, stderr)
	}
	// Without --key: the expired records, in batches of one.
	seed(t, b.store, idemstore.Identity{Scope: acme, Endpoint: payments, Key: "k-expired-2"}, idemstore.StateInProgress, 0)
	code, out, stderr = b.keys(t, vars, "purge", "--batch-size", "1")
	if code != ExitOK || !strings.HasPrefix(out, "Purged 2 expired records.\n") || !strings.Contains(stderr, "action=purge_expired count=2 operator=bob") {
		t.Errorf("purge: exit %d, stdout %q, stderr %s", code, out, stderr)
	}
	if code, out, _ := b.keys(t, vars, "purge"); code != ExitOK || !strings.HasPrefix(out, "Purged 0 expired records.\n") {
		t.Errorf("second purge: exit %d, stdout %q", code, out)
	}
	if recs, err := b.store.KeyList(ctx, &idemstore.ListParams{Scope: acme}); err != nil || len(recs) != 4 {
		t.Errorf("records left after purging = %d, %v; want the 4 live ones (the unknown one was purged with --force)", len(recs), err)
	}
}

// fencingStore lets another writer change a record between the command's
// read and its resolution: before the first KeyResolve it settles the
// record itself, lets a retry take it over and marks that retry's outcome
// unknown, so the record is unknown again under another token.
type fencingStore struct {
	idemstore.Store
	t    *testing.T
	done bool
}

func (s *fencingStore) KeyResolve(ctx context.Context, p *idemstore.ResolveParams) error {
	if !s.done {
		s.done = true
		rec, err := s.Store.KeyGet(ctx, p.Identity)
		if err != nil {
			s.t.Fatal(err)
		}
		steps := []error{
			s.Store.KeyResolve(ctx, &idemstore.ResolveParams{Identity: p.Identity, Token: rec.Token, To: idemstore.StateReleased}),
		}
		res, err := s.Store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: p.Identity, Fingerprint: rec.Fingerprint,
			Token: "second-attempt", Lease: time.Hour, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown})
		if err == nil && !res.Reserved {
			err = fmt.Errorf("not reserved: %+v", res.Record)
		}
		steps = append(steps, err, s.Store.KeyMarkUnknown(ctx, &idemstore.FinishParams{Identity: p.Identity, Token: "second-attempt"}))
		if err := errors.Join(steps...); err != nil {
			s.t.Fatalf("changing the record behind the command: %v", err)
		}
	}
	return s.Store.KeyResolve(ctx, p)
}

// A resolution is fenced on the token read just before it: when the record
// changed in between, nothing is written and the command exits 1.
func TestKeysResolveIsFenced(t *testing.T) {
	t.Parallel()
	for _, kb := range keysBackends {
		t.Run(kb.name, func(t *testing.T) {
			t.Parallel()
			b := kb.new(t)
			id := idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "k"}
			seed(t, b.store, id, idemstore.StateUnknown, time.Hour)
			fenced := &fencingStore{Store: b.store, t: t}
			code, out, stderr := runKeysIn(t, sharedOpener(fenced), nil,
				"resolve", "--store", b.url, "--tenant", "acme", "--endpoint", payments, "--to", "completed", "--status", "200", "k")
			if code != ExitError || out != "" || !strings.Contains(stderr, "idem keys: the record changed after it was read") ||
				!strings.Contains(stderr, "nothing was written") || strings.Contains(stderr, "record resolved") {
				t.Errorf("resolve of a record that changed: exit %d, stdout %q, stderr %s; want exit 1 and the reason", code, out, stderr)
			}
			rec, err := b.store.KeyGet(t.Context(), id)
			if err != nil || rec.State != idemstore.StateUnknown || rec.Token != "second-attempt" || rec.Response != nil {
				t.Errorf("record = %+v, %v; want the second attempt's unknown record untouched", rec, err)
			}
		})
	}
}

// `idem keys list` prints the newest records first, whatever order the
// store lists them in, and finds a key by --key or --prefix among any
// number of newer ones: after a load run, `--key order-1001` still finds
// the payment made before it.
func TestKeysListNewestFirstAndByKey(t *testing.T) {
	t.Parallel()
	clock := idemtest.NewClock(time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC))
	s := idemmem.New(&idemmem.Config{Now: clock.Now})
	open := sharedOpener(s)
	seedAt := func(scope, key string) {
		seed(t, s, idemstore.Identity{Scope: scope, Endpoint: payments, Key: key}, idemstore.StateCompleted, 24*time.Hour)
		clock.Advance(time.Second)
	}
	seedAt("shop", "order-1001") // the oldest
	for i := range 1200 {        // more than a page of the store (listPage)
		seedAt("shop", fmt.Sprintf("load-%04d", i))
	}
	seedAt("acme", "order-1002") // the newest; "acme" lists first by identity
	keysOf := func(args ...string) []string {
		t.Helper()
		code, stdout, stderr := runKeysIn(t, open, nil, append([]string{"list", "--store", "memory:", "--json"}, args...)...)
		if code != ExitOK {
			t.Fatalf("idem keys list %v: exit %d: %s", args, code, stderr)
		}
		var keys []string
		for line := range strings.Lines(stdout) {
			var j jsonRecord
			if err := json.Unmarshal([]byte(line), &j); err != nil {
				t.Fatalf("line %q: %v", line, err)
			}
			keys = append(keys, j.Key)
		}
		return keys
	}
	if got, want := keysOf("--limit", "3"), []string{"order-1002", "load-1199", "load-1198"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--limit 3 = %v, want the newest three %v", got, want)
	}
	if got, want := keysOf("--key", "order-1001"), []string{"order-1001"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--key order-1001 = %v, want %v", got, want)
	}
	if got, want := keysOf("--prefix", "order-"), []string{"order-1002", "order-1001"}; !reflect.DeepEqual(got, want) {
		t.Errorf("--prefix order- = %v, want %v", got, want)
	}
	if got := keysOf("--key", "order-"); len(got) != 0 {
		t.Errorf("--key matches whole keys only: --key order- = %v", got)
	}
	if got := keysOf("--prefix", "load-", "--limit", "0"); len(got) != 1200 || got[0] != "load-1199" || got[1199] != "load-0000" {
		t.Errorf("--prefix load- --limit 0: %d keys, first %v", len(got), got[:min(2, len(got))])
	}
	// The table too, with the hint that more match.
	code, stdout, stderr := runKeysIn(t, open, nil, "list", "--store", "memory:", "--prefix", "load-", "--limit", "2")
	rows := strings.Split(strings.TrimSpace(stdout), "\n")
	if code != ExitOK || len(rows) != 3 || !strings.Contains(rows[1], "load-1199") || !strings.Contains(rows[2], "load-1198") {
		t.Errorf("table --prefix load- --limit 2: exit %d\n%s", code, stdout)
	}
	if !strings.Contains(stderr, "1198 more records match") {
		t.Errorf("stderr %q, want the count of the records not shown", stderr)
	}
}
