package cli

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemmem"
	"github.com/idem-dev/idem/idemstore"
)

func TestParseMaintain(t *testing.T) {
	t.Parallel()
	def := maintainOptions{store: "sqlite:./idem.db", sweepInterval: 10 * time.Second, reapInterval: time.Minute, batchSize: 1000,
		reconcile: reconcileOptions{timeout: 5 * time.Second, interval: 30 * time.Second, concurrency: 4}}
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(o *maintainOptions)
		wantErr string
	}{
		{name: "defaults", want: func(*maintainOptions) {}},
		{name: "every flag", args: []string{"--store", "memory:", "--sweep-interval", "1s", "--reap-interval", "2s", "--batch-size", "10", "--once"},
			want: func(o *maintainOptions) {
				o.store, o.sweepInterval, o.reapInterval, o.batchSize, o.once = "memory:", time.Second, 2*time.Second, 10, true
			}},
		{name: "every variable",
			env: map[string]string{"IDEM_STORE": "redis://r/0", "IDEM_SWEEP_INTERVAL": "1s", "IDEM_REAP_INTERVAL": "2s", "IDEM_BATCH_SIZE": "10", "IDEM_ONCE": "1"},
			want: func(o *maintainOptions) {
				o.store, o.sweepInterval, o.reapInterval, o.batchSize, o.once = "redis://r/0", time.Second, 2*time.Second, 10, true
			}},
		{name: "flag wins over variable", args: []string{"--once=false", "--batch-size", "5"}, env: map[string]string{"IDEM_ONCE": "true", "IDEM_BATCH_SIZE": "7"},
			want: func(o *maintainOptions) { o.batchSize = 5 }},

		{name: "sweep interval zero", args: []string{"--sweep-interval", "0"}, wantErr: "want a positive duration"},
		{name: "reap interval not a duration", args: []string{"--reap-interval", "60"}, wantErr: "want a Go duration"},
		{name: "batch size zero", args: []string{"--batch-size", "0"}, wantErr: "--batch-size must be positive"},
		{name: "bad variable", env: map[string]string{"IDEM_SWEEP_INTERVAL": "x"}, wantErr: `invalid value "x" for IDEM_SWEEP_INTERVAL`},
		{name: "bad once variable", env: map[string]string{"IDEM_ONCE": "yes"}, wantErr: `invalid value "yes" for IDEM_ONCE`},
		{name: "positional", args: []string{"now"}, wantErr: `unexpected argument "now"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			o, err := parseMaintain(tt.args, newTestEnv(tt.env).env)
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

func TestProxyMaintainFlag(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		args []string
		env  map[string]string
		want bool
	}{
		{nil, nil, false},
		{[]string{"--maintain"}, nil, true},
		{nil, map[string]string{"IDEM_MAINTAIN": "true"}, true},
		{[]string{"--maintain=false"}, map[string]string{"IDEM_MAINTAIN": "true"}, false},
	} {
		o, err := parseProxy(append([]string{"--upstream", "http://u"}, tt.args...), newTestEnv(tt.env).env)
		if err != nil || o.maintain != tt.want {
			t.Errorf("parseProxy(%q, %v): maintain = %v, %v; want %v", tt.args, tt.env, o != nil && o.maintain, err, tt.want)
		}
	}
}

// runMaintainIn runs `idem maintain ARGS` in process on the store opener
// until ctx ends, and returns its error.
func runMaintainIn(ctx context.Context, e *testEnv, open storeOpener, args ...string) error {
	return maintainMain(ctx, e.env, args, open)
}

// `idem maintain --once` sweeps an expired lease to unknown, reaps an
// expired record, and reports the unknown records an operator must settle.
func TestMaintainOnce(t *testing.T) {
	t.Parallel()
	for _, kb := range keysBackends {
		t.Run(kb.name, func(t *testing.T) {
			t.Parallel()
			b := kb.new(t)
			ctx := t.Context()
			crashed := idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "k-crashed"}
			// A lease of zero has expired at once: the attempt "crashed".
			if res, err := b.store.KeyReserve(ctx, &idemstore.ReserveParams{Identity: crashed, Fingerprint: "f", Token: "t",
				Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil || !res.Reserved {
				t.Fatalf("reserving: %+v, %v", res, err)
			}
			seed(t, b.store, idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "k-expired"}, idemstore.StateInProgress, 0)
			seed(t, b.store, idemstore.Identity{Scope: "acme", Endpoint: payments, Key: "k-live"}, idemstore.StateInProgress, time.Hour)

			e := newTestEnv(nil)
			if err := runMaintainIn(ctx, e, b.open, "--once", "--store", b.url); err != nil {
				t.Fatalf("idem maintain --once: %v\nstderr: %s", err, e.stderr)
			}
			out := e.stdout.String()
			for _, want := range []string{
				"Swept 1 expired leases, reaped 1 expired records.\n",
				"1 unknown records await an operator: 'idem keys list --state unknown', then 'idem keys resolve'.\n",
				"Oldest attempt in progress: ",
			} {
				if !strings.Contains(out, want) {
					t.Errorf("stdout lacks %q:\n%s", want, out)
				}
			}
			logs := e.stderr.String()
			if !strings.Contains(logs, `level=WARN msg="idemmaint: lease expired, outcome unknown until reconciled" key_hash=`+crashed.LogHash()) ||
				!strings.Contains(logs, `level=WARN msg="idem maintain: unknown records await an operator`) {
				t.Errorf("logs lack the swept record or the unknown backlog:\n%s", logs)
			}
			if strings.Contains(logs, "k-crashed") {
				t.Errorf("logs name the key:\n%s", logs)
			}
			recs, err := b.store.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateUnknown})
			if err != nil || len(recs) != 1 || recs[0].Key != "k-crashed" {
				t.Errorf("unknown records = %v, %v; want k-crashed", recs, err)
			}
			// The sweep was written: a second run finds nothing to sweep.
			e = newTestEnv(nil)
			if err := runMaintainIn(ctx, e, b.open, "--once", "--store", b.url); err != nil {
				t.Fatal(err)
			}
			if out := e.stdout.String(); !strings.HasPrefix(out, "Swept 0 expired leases, reaped 0 expired records.\n1 unknown records") {
				t.Errorf("second run printed %q", out)
			}
		})
	}
}

func TestMaintainOnceThroughRun(t *testing.T) {
	t.Parallel()
	code, stdout, stderr := runCommand(t, nil, "maintain", "--once", "--store", sqliteURL(t))
	if code != ExitOK || stdout != "Swept 0 expired leases, reaped 0 expired records.\n" {
		t.Errorf("idem maintain --once on an empty store: exit %d, stdout %q, stderr %s", code, stdout, stderr)
	}
	code, _, stderr = runCommand(t, nil, "maintain", "--once", "--store", "sqlite:/nonexistent-dir/x/idem.db")
	if code != ExitError || !strings.Contains(stderr, "idem maintain: opening the store:") {
		t.Errorf("idem maintain on an unopenable store: exit %d, stderr %s", code, stderr)
	}
}

// In the background the maintainer sweeps on its interval and stops when
// the context ends.
func TestMaintainRunsUntilStopped(t *testing.T) {
	t.Parallel()
	store := idemmem.New(nil)
	e := newTestEnv(nil)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		done <- runMaintainIn(ctx, e, sharedOpener(store), "--store", "memory:", "--sweep-interval", "10ms")
	}()
	if !e.stderr.waitFor("msg=maintaining", 10*time.Second) {
		t.Fatalf("the maintainer did not start:\n%s", e.stderr)
	}
	// A lease that expires after the first pass is swept by a later one.
	id := idemstore.Identity{Endpoint: payments, Key: "k"}
	if _, err := store.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
		Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	if !e.stderr.waitFor("key_hash="+id.LogHash(), 10*time.Second) {
		t.Fatalf("the expired lease was not swept:\n%s", e.stderr)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("idem maintain returned %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("idem maintain did not stop within 10s")
	}
	logs := e.stderr.String()
	for _, want := range []string{"store=memory", "reconciler=none", `msg="shutting down"`, "msg=stopped swept=1"} {
		if !strings.Contains(logs, want) {
			t.Errorf("logs lack %q:\n%s", want, logs)
		}
	}
}

// `idem proxy --maintain` sweeps the store it serves.
func TestProxyMaintains(t *testing.T) {
	t.Parallel()
	u := sqliteURL(t)
	store, closeStore, err := storeurl.Open(t.Context(), u)
	if err != nil {
		t.Fatal(err)
	}
	defer closeStore()
	id := idemstore.Identity{Endpoint: payments, Key: "k"}
	if _, err := store.KeyReserve(t.Context(), &idemstore.ReserveParams{Identity: id, Fingerprint: "f", Token: "t",
		Lease: 0, TTL: time.Hour, LeaseExpiredState: idemstore.StateUnknown}); err != nil {
		t.Fatal(err)
	}
	_, e, stop := startProxy(t, "--upstream", "http://127.0.0.1:9", "--store", u, "--maintain")
	if !e.stderr.waitFor(`outcome unknown until reconciled" key_hash=`+id.LogHash(), 10*time.Second) {
		t.Fatalf("the proxy's maintainer did not sweep the expired lease:\n%s", e.stderr)
	}
	if code := stop(); code != ExitOK {
		t.Errorf("exit code = %d; stderr: %s", code, e.stderr)
	}
	if !strings.Contains(e.stderr.String(), "maintain=true") {
		t.Errorf("the start log does not say the proxy maintains:\n%s", e.stderr)
	}
	recs, err := store.KeyList(t.Context(), &idemstore.ListParams{State: idemstore.StateUnknown})
	if err != nil || len(recs) != 1 {
		t.Errorf("unknown records = %v, %v; want the swept one", recs, err)
	}
}

// `idem maintain --once` says when its reconciliation pass had no time for
// some due records, and what to do.
func TestPrintMaintainStatsLeft(t *testing.T) {
	t.Parallel()
	e := newTestEnv(nil)
	printMaintainStats(e.env, idemmaint.Stats{Completed: 20, UnknownBacklog: 30, ReconcileLeft: 30})
	want := "30 due unknown records had no time in this pass: run it again, or raise --reconcile-concurrency.\n"
	if out := e.stdout.String(); !strings.Contains(out, want) {
		t.Errorf("stdout lacks %q:\n%s", want, out)
	}
	e = newTestEnv(nil)
	printMaintainStats(e.env, idemmaint.Stats{Completed: 20})
	if out := e.stdout.String(); strings.Contains(out, "had no time") {
		t.Errorf("stdout speaks of records left when there is none:\n%s", out)
	}
}
