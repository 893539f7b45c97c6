package cli

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/idem-dev/idem"
	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
	"github.com/idem-dev/idem/cmd/idem/internal/provider"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/internal/redact"
	"github.com/idem-dev/idem/outbox"
)

// demoTenant is the tenant made when --tokens is not given.
const demoTenant = "demo"

// crashEnv names the testing hook that makes `idem payments` kill itself
// with SIGKILL at a crash point (paysvc.CrashPoint), for the crash tests.
// It is not a flag and not user documentation.
const crashEnv = "IDEM_PAYMENTS_CRASH_AT"

// paymentsOptions are the settings of `idem payments`.
type paymentsOptions struct {
	listen            string
	providerListen    string
	providerURL       *url.URL
	providerStore     string
	store             string
	events            string            // --events: nats://… or amqp://…; "" publishes no events
	tokensRaw         string            // --tokens as given
	tokens            map[string]string // tenant → token; nil: a demo tenant
	faults            provider.Faults
	relayWorkers      int
	relayInterval     time.Duration
	reconcileInterval time.Duration
	maxAttempts       int
	deliverTimeout    time.Duration
	lease             time.Duration
	settleAfter       time.Duration
	demo              bool
	crashAt           paysvc.CrashPoint
	keyring           keyringFlag
	ops               opsOptions
	guards            safeguardOptions
}

// parsePayments reads the flags of `idem payments` and their IDEM_*
// fallbacks.
func parsePayments(args []string, e *env) (*paymentsOptions, error) {
	o := &paymentsOptions{
		listen:            "127.0.0.1:8080",
		providerListen:    "127.0.0.1:8081",
		store:             paysvc.DefaultStore,
		relayWorkers:      paysvc.DefaultRelayWorkers,
		relayInterval:     paysvc.DefaultRelayInterval,
		reconcileInterval: paysvc.DefaultReconcileInterval,
		maxAttempts:       paysvc.DefaultMaxAttempts,
		deliverTimeout:    paysvc.DefaultDeliverTimeout,
		lease:             30 * time.Second,
		settleAfter:       paysvc.DefaultSettleAfter,
		demo:              true,
		guards:            defaultSafeguards(),
	}
	fs := newFlagSet("payments", "idem payments [flags]",
		"Runs the reference payments service: POST /v1/payments writes the payment, an\n"+
			"outbox row and the Idempotency-Key's completion in one transaction; relays charge\n"+
			"a simulated provider (in-process, or --provider-url) with a key derived from the\n"+
			"request, retry with backoff, and reconcile unknown outcomes by asking the provider.")
	fs.StringVar(&o.listen, "listen", o.listen, "`ADDR` of the API; port 0 picks a free one")
	fs.StringVar(&o.providerListen, "provider-listen", o.providerListen, "`ADDR` of the in-process provider")
	fs.Var(httpURLValue{&o.providerURL}, "provider-url", "`URL` of an external provider (idem provider) to use instead of starting one")
	fs.Var(sqlStoreValue{&o.providerStore}, "provider-store", "ledger `URL` of the in-process provider: sqlite:PATH, postgres://… or mysql://… (default: beside --store: a file NAME-provider.db next to its file, the schema NAME_provider in its PostgreSQL database, or sqlite:./idem-provider.db beside a MySQL store)")
	fs.Var(sqlStoreValue{&o.store}, "store", "database `URL` of the service: sqlite:PATH, postgres://… (?schema=NAME) or mysql://user:pass@host:3306/db")
	fs.Var(eventsValue{&o.events}, "events", "`URL` where each succeeded payment publishes a payment.succeeded event through the outbox: nats://HOST:4222 (JetStream; ?subject=, ?stream=) or amqp://USER:PASS@HOST:5672/ (RabbitMQ; ?exchange=)")
	fs.Var(secretValue{&o.tokensRaw}, "tokens", "`TENANT=TOKEN,…` bearer tokens; without it a demo tenant and token are made and printed")
	registerFaults(fs, &o.faults, "provider-")
	fs.Var(positiveIntValue{&o.relayWorkers}, "relay-workers", "`N` outbox relays charging in parallel")
	fs.Var(durationValue{p: &o.relayInterval}, "relay-interval", "`DURATION` between relay passes when idle (a new payment wakes them)")
	fs.Var(durationValue{p: &o.reconcileInterval}, "reconcile-interval", "`DURATION` between reconciliation passes")
	fs.Var(positiveIntValue{&o.maxAttempts}, "max-attempts", "`N` charge attempts before a payment's outbox row is dead-lettered")
	fs.Var(durationValue{p: &o.lease}, "lease", "`DURATION` of a payment request's in-progress lock, renewed while it runs; after a crash a retry waits this long")
	fs.Var(durationValue{p: &o.deliverTimeout}, "deliver-timeout", "`DURATION` a charge may take before its outcome is unknown")
	fs.Var(durationValue{p: &o.settleAfter}, "settle-after", "`DURATION` after a dead-lettered charge's last attempt before \"no charge at the provider\" fails the payment")
	fs.BoolVar(&o.demo, "demo", o.demo, "with the demo tenant on a fresh database, send one payment twice at start to show the replay")
	o.keyring.register(fs)
	o.keyring.registerRequired(fs)
	o.guards.register(fs)
	o.ops.register(fs)
	err := fs.parse(args, e)
	if err != nil {
		return nil, err
	}
	if err := o.keyring.check(); err != nil {
		return nil, err
	}
	if o.tokensRaw != "" {
		// Checked here, not by the flag: the flag package would quote the
		// tokens in its error.
		if o.tokens, err = parseTokens(o.tokensRaw); err != nil {
			return nil, usageErrorf("--tokens (or %s): %v", envName("tokens"), err)
		}
	}
	if o.providerStore == "" {
		if o.providerStore, err = providerStoreBeside(o.store); err != nil {
			return nil, usageErrorf("--provider-store: %v", err)
		}
	}
	if v, ok := e.lookupEnv(crashEnv); ok && v != "" {
		if !slices.Contains(paysvc.CrashPoints, paysvc.CrashPoint(v)) {
			return nil, usageErrorf("invalid value %q for %s: want one of %v", v, crashEnv, paysvc.CrashPoints)
		}
		o.crashAt = paysvc.CrashPoint(v)
	}
	return o, nil
}

// providerStoreBeside returns the in-process provider's ledger for the
// service's store: for sqlite:DIR/NAME.db the file DIR/NAME-provider.db
// (sqlite:./idem.db gives sqlite:./idem-provider.db), for PostgreSQL the
// same database with the schema NAME_provider (NAME is the store's schema,
// "idem" when it has none), so the provider's own idempotency records stay
// apart from the service's. Beside a MySQL store it is
// provider.DefaultStore, a SQLite file in the working directory: another
// database would need the right to create one (--provider-store names a
// mysql:// one).
func providerStoreBeside(store string) (string, error) {
	switch storeurl.Kind(store) {
	case storeurl.KindSQLite:
		_, rest, _ := strings.Cut(store, ":")
		path, query, hasQuery := strings.Cut(rest, "?")
		ext := filepath.Ext(path)
		path = strings.TrimSuffix(path, ext) + "-provider" + cmp.Or(ext, ".db")
		if hasQuery {
			path += "?" + query
		}
		return "sqlite:" + path, nil
	case storeurl.KindPostgres:
		u, err := url.Parse(store)
		if err != nil {
			return "", errors.New("the store URL does not parse")
		}
		q := u.Query()
		q.Set("schema", cmp.Or(q.Get("schema"), "idem")+"_provider")
		u.RawQuery = q.Encode()
		return u.String(), nil
	}
	return provider.DefaultStore, nil
}

// secretValue is a string flag whose value is never shown.
type secretValue struct{ p *string }

func (v secretValue) String() string {
	if v.p == nil || *v.p == "" {
		return ""
	}
	return "…"
}

func (secretValue) hidden() {}

func (v secretValue) Set(s string) error {
	*v.p = s
	return nil
}

// parseTokens reads TENANT=TOKEN pairs separated by commas. Its errors never
// show a token.
func parseTokens(s string) (map[string]string, error) {
	m := make(map[string]string)
	tokens := make(map[string]bool)
	for pair := range strings.SplitSeq(s, ",") {
		tenant, token, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok {
			return nil, errors.New("want TENANT=TOKEN pairs separated by commas")
		}
		if err := paysvc.ValidateTenant(tenant); err != nil {
			return nil, errors.New(strings.TrimPrefix(err.Error(), "payments: "))
		}
		if err := paysvc.ValidateToken(token); err != nil {
			return nil, fmt.Errorf("the token of tenant %q: %w", tenant, err)
		}
		if _, dup := m[tenant]; dup {
			return nil, fmt.Errorf("tenant %q is named twice", tenant)
		}
		if tokens[token] {
			return nil, fmt.Errorf("the token of tenant %q is another tenant's too", tenant)
		}
		m[tenant], tokens[token] = token, true
	}
	return m, nil
}

// positiveIntValue is an integer of at least 1.
type positiveIntValue struct{ p *int }

func (v positiveIntValue) String() string {
	if v.p == nil {
		return ""
	}
	return fmt.Sprint(*v.p)
}

func (v positiveIntValue) Set(s string) error {
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil || n < 1 || fmt.Sprint(n) != s {
		return errors.New("want a whole number of at least 1")
	}
	*v.p = n
	return nil
}

// lateMetrics forwards to the metrics of the operations endpoints, which
// are built once the service (and its store) exist.
type lateMetrics struct{ idem.Metrics }

func runPayments(ctx context.Context, e *env, args []string) (err error) {
	o, err := parsePayments(args, e)
	if err != nil {
		return err
	}
	tokens := o.tokens
	demo := tokens == nil

	// The in-process provider's address is taken first, for the service's
	// configuration; the provider opens its ledger after the service opened
	// its store, so a store that cannot be opened is reported by the URL
	// the user gave, not by the ledger's derived from it.
	providerURL := ""
	var providerLn net.Listener
	if o.providerURL != nil {
		providerURL = o.providerURL.String()
	} else {
		providerLn, err = net.Listen("tcp", o.providerListen)
		if err != nil {
			return fmt.Errorf("starting the provider: %w", err)
		}
		defer func() {
			if providerLn != nil { // not served
				providerLn.Close()
			}
		}()
		providerURL = "http://" + providerLn.Addr().String()
	}

	keyring, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	var events outbox.Publisher
	if o.events != "" {
		pub, closeEvents, err := openEvents(ctx, o.events, e.logger)
		if err != nil {
			return err
		}
		// Closed after the service: the relays finish the event in flight.
		defer closeEvents()
		events = pub
	}
	metrics := &lateMetrics{}
	cfg := &paysvc.Config{
		Keyring:            keyring,
		EncryptionRequired: o.keyring.required,
		Store:              o.store,
		Events:             events,
		Tokens:             tokens,
		ProviderURL:        providerURL,
		RelayWorkers:       o.relayWorkers,
		RelayInterval:      o.relayInterval,
		ReconcileInterval:  o.reconcileInterval,
		MaxAttempts:        o.maxAttempts,
		DeliverTimeout:     o.deliverTimeout,
		KeyLease:           o.lease,
		SettleAfter:        o.settleAfter,
		Metrics:            metrics,
		Logger:             e.logger,

		BodyTimeout:              o.guards.bodyTimeout,
		MinKeyLength:             o.guards.minKeyLength,
		MaxInProgressPerScope:    o.guards.maxInProgressPerScope,
		NewKeysPerSecondPerScope: o.guards.newKeysPerSecond,
	}
	if demo {
		// The demo token is kept in the database: copied curl lines keep
		// working after a restart.
		cfg.DemoTenant = demoTenant
	}
	if o.crashAt != "" {
		cfg.Crash = crashHook(e, o.crashAt)
	}
	svc, err := paysvc.New(ctx, cfg)
	if err != nil {
		return fmt.Errorf("opening the service: %w", err)
	}
	if providerLn != nil {
		ln := providerLn
		providerLn = nil // Serve closes it on failure
		prov, err := provider.Serve(ln, &provider.Config{Store: o.providerStore, Faults: o.faults, Logger: e.logger})
		if err != nil {
			return errors.Join(fmt.Errorf("starting the provider: %w", err), svc.Close())
		}
		// Deferred before the service's Close, so it runs after it: the
		// relays finish the charge in flight against a live provider.
		defer func() {
			if cerr := prov.Close(); cerr != nil {
				err = errors.Join(err, fmt.Errorf("closing the provider: %w", cerr))
			}
		}()
	}
	if demo {
		tokens = map[string]string{demoTenant: svc.DemoToken()}
	}
	defer func() {
		// After the HTTP drain: the relays finish the charge in flight.
		if cerr := svc.Close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the service: %w", cerr))
		}
	}()

	opsHandler, err := newOps(&o.ops, opsParts{Store: svc.Store(), Maintainer: svc.Maintainer(), Outbox: svc.Outbox(), Payments: svc, Logger: e.logger,
		TenantLabel: o.guards.tenantLabel})
	if err != nil {
		return err
	}
	metrics.Metrics = opsHandler.Metrics
	opsCtx, stopOps := context.WithCancel(ctx)
	waitOps, err := startOps(opsCtx, e, &o.ops, opsHandler)
	if err != nil {
		stopOps()
		return err
	}
	defer waitOps()
	defer stopOps()

	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	// The workers outlive ctx: after the HTTP drain, Close stops them and
	// lets the charge in flight finish and be recorded.
	if err := svc.Start(context.WithoutCancel(ctx)); err != nil {
		ln.Close()
		return err
	}
	api := "http://" + ln.Addr().String()
	e.logger.Info("listening",
		"addr", ln.Addr().String(),
		"provider", storeurl.Redact(providerURL),
		"store", storeurl.Kind(o.store),
		"store_url", storeurl.Redact(o.store),
		"tenants", len(tokens),
		"encryption_keys", keyNames(keyring),
	)
	printBanner(e.stdout, o, api, providerURL, demo, tokens)

	var demoDone sync.WaitGroup
	if demo && o.demo && svc.Fresh() {
		// Only on a fresh database: a durable one does not gather a demo
		// payment at every start.
		demoCtx, stopDemo := context.WithCancel(ctx)
		defer stopDemo()
		demoDone.Go(func() { showReplay(demoCtx, e, api, tokens[demoTenant]) })
	}
	err = serveWith(ctx, e, ln, svc.Handler(), o.guards.bodyTimeout, nil)
	demoDone.Wait()
	return err
}

// printBanner tells where the service listens and how to try it.
func printBanner(w io.Writer, o *paymentsOptions, api, providerURL string, demo bool, tokens map[string]string) {
	token := "TOKEN"
	if demo {
		token = tokens[demoTenant]
	}
	where := "in-process"
	if o.providerURL != nil {
		where = "external"
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "idem payments is running.\n\n")
	fmt.Fprintf(&b, "  API       %s/v1/payments\n", api)
	fmt.Fprintf(&b, "  provider  %s (%s; its ledger: GET %s/charges)\n", storeurl.Redact(providerURL), where, storeurl.Redact(providerURL))
	fmt.Fprintf(&b, "  store     %s\n", storeurl.Redact(o.store))
	if o.events != "" {
		fmt.Fprintf(&b, "  events    %s (payment.succeeded, through the outbox)\n", redact.URL(o.events))
	}
	if o.providerURL == nil {
		fmt.Fprintf(&b, "  ledger    %s (the in-process provider's; --provider-store to move it)\n", storeurl.Redact(o.providerStore))
	}
	if o.ops.addr != "" {
		fmt.Fprintf(&b, "  metrics   http://%s/metrics\n", o.ops.addr)
	}
	if url := o.ops.consoleURL(); url != "" {
		fmt.Fprintf(&b, "  console   %s (%s)\n", url, consoleSignIn)
	}
	fmt.Fprintf(&b, "  pid       %d (Ctrl-C or kill -TERM %d stops it; `go run`'s own PID is another process)\n", os.Getpid(), os.Getpid())
	if demo {
		fmt.Fprintf(&b, "  tenant    %q, token %s (kept in the store, the same at every start; --tokens TENANT=TOKEN,… for your own)\n", demoTenant, token)
	} else {
		fmt.Fprintf(&b, "  tenants   %d, from --tokens\n", len(tokens))
	}
	fmt.Fprintf(&b, "\nTry it:\n\n")
	fmt.Fprintf(&b, "  curl -i %s/v1/payments \\\n", api)
	fmt.Fprintf(&b, "    -H 'Authorization: Bearer %s' \\\n", token)
	fmt.Fprintf(&b, "    -H 'Idempotency-Key: order-1001' \\\n")
	fmt.Fprintf(&b, "    -H 'Content-Type: application/json' \\\n")
	fmt.Fprintf(&b, "    -d '{\"customer_id\":\"cus_42\",\"amount_cents\":1999,\"currency\":\"EUR\"}'\n\n")
	fmt.Fprintf(&b, "  Run it twice: the second answer is the first one, with Idempotent-Replayed: true.\n")
	fmt.Fprintf(&b, "  Change the amount and keep the key: 422 key-reused.\n\n")
	fmt.Fprintf(&b, "  curl -s %s/v1/payments -H 'Authorization: Bearer %s'\n", api, token)
	fmt.Fprintf(&b, "  curl -s %s/charges\n\n", storeurl.Redact(providerURL))
	w.Write(b.Bytes())
}

// showReplay sends one demo payment twice with the same key and prints both
// answers: the second is the first, replayed.
func showReplay(ctx context.Context, e *env, api, token string) {
	key := "demo-" + randomHex(6)
	body := []byte(`{"customer_id":"cus_demo","amount_cents":1999,"currency":"EUR"}`)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	var b bytes.Buffer
	fmt.Fprintf(&b, "A retry, replayed: POST /v1/payments twice with Idempotency-Key: %s\n", key)
	for i, label := range []string{"first ", "retry "} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, api+"/v1/payments", bytes.NewReader(body))
		if err != nil {
			return
		}
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set(idem.HeaderKey, key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			e.logger.Warn("the start-up demo failed", "error", err)
			return
		}
		answer, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
		resp.Body.Close()
		replayed := ""
		if resp.Header.Get(idem.HeaderReplayed) == "true" {
			replayed = "   Idempotent-Replayed: true"
		}
		fmt.Fprintf(&b, "  %s %s%s\n    %s\n", label, resp.Status, replayed, bytes.TrimSpace(answer))
		if i == 1 {
			fmt.Fprintf(&b, "  One payment, one charge: the relay charges it in the background.\n\n")
		}
	}
	e.stdout.Write(b.Bytes())
}

// crashHook returns the Crash hook of the IDEM_PAYMENTS_CRASH_AT testing
// hook: at the named point the process kills itself with SIGKILL, leaving
// whatever was or was not committed, as a power cut would.
func crashHook(e *env, at paysvc.CrashPoint) func(paysvc.CrashPoint) {
	e.logger.Warn("testing hook: the process will kill itself", "env", crashEnv, "crash_at", string(at))
	return func(p paysvc.CrashPoint) {
		if p != at {
			return
		}
		e.logger.Warn("testing hook: killing the process", "crash_at", string(p))
		proc, err := os.FindProcess(os.Getpid())
		if err == nil {
			err = proc.Kill() // SIGKILL on Unix
		}
		if err != nil {
			os.Exit(137)
		}
		select {} // the signal is on its way
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}
