package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/proxy"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/idemmaint"
)

// The proxy's defaults differ from the payments service's (127.0.0.1:8080,
// sqlite:./idem.db), so the README's two demos run side by side in one
// terminal.
const (
	defaultProxyListen = "127.0.0.1:8090"
	defaultProxyStore  = "sqlite:./idem-proxy.db"
)

// proxyOptions are the settings of `idem proxy`.
type proxyOptions struct {
	listen      string
	upstream    *url.URL
	store       string
	ttl         time.Duration
	lease       time.Duration
	wait        time.Duration
	profile     string
	requireKey  bool
	scopeHeader string
	methods     []string
	maxBody     int64
	maxResponse int64
	maintain    bool
	cache       string
	keyring     keyringFlag
	redact      []string
	ops         opsOptions
	reconcile   reconcileOptions
	guards      safeguardOptions
	async       bool
	problemBase string
	// metricsRoutes and metricsSegments name requests in the metrics
	// (idem.Config.MetricsEndpoint): never by their raw path.
	metricsRoutes   *http.ServeMux
	metricsSegments int
}

// parseProxy reads the flags of `idem proxy` and their IDEM_* fallbacks.
// The defaults shown are the middleware's own (idem.Config).
func parseProxy(args []string, e *env) (*proxyOptions, error) {
	o := &proxyOptions{
		listen:      defaultProxyListen,
		store:       defaultProxyStore,
		ttl:         24 * time.Hour,
		lease:       30 * time.Second,
		profile:     string(idem.ProfileIETF),
		maxBody:     1 << 20,
		maxResponse: 1 << 20,
		guards:      defaultSafeguards(),
		problemBase: idem.DefaultProblemBaseURI,
	}
	fs := newFlagSet("proxy", "idem proxy --upstream URL [flags]",
		"Puts the idempotency contract in front of any HTTP API: a request with an\n"+
			"Idempotency-Key is forwarded to the upstream at most once, and every retry\n"+
			"gets the stored answer with Idempotent-Replayed: true. The upstream call runs\n"+
			"to its end even when the client hangs up.")
	fs.StringVar(&o.listen, "listen", o.listen, "`ADDR` to serve on; port 0 picks a free one")
	fs.Var(httpURLValue{&o.upstream}, "upstream", "`URL` of the API to protect (required)")
	fs.Var(storeValue{&o.store}, "store", "store `URL`: sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	fs.Var(durationValue{p: &o.ttl}, "ttl", "`DURATION` a key is kept (Go syntax: 30s, 24h)")
	fs.Var(durationValue{p: &o.lease}, "lease", "`DURATION` of the in-progress lock, renewed while the upstream works")
	fs.Var(durationValue{p: &o.wait, zeroOK: true}, "wait", "`DURATION` a retry waits for a key in progress; 0 answers 409 at once")
	fs.Var(oneOfValue{&o.profile, []string{string(idem.ProfileIETF), string(idem.ProfileStripe), string(idem.ProfileAppstrate)}},
		"profile", "`PROFILE` of the answers to key reuse and 5xx: ietf, stripe or appstrate")
	fs.BoolVar(&o.requireKey, "require-key", o.requireKey, "answer 400 key-missing to a covered request without Idempotency-Key")
	fs.Var(headerNameValue{&o.scopeHeader}, "scope-header", "header `NAME` whose value's SHA-256 scopes the keys; a protected request without it gets 401")
	fs.Var(methodsValue{&o.methods}, "methods", "comma-separated `METHODS` protected; others pass through (default POST,PATCH; with --profile appstrate POST,PUT,PATCH,DELETE)")
	fs.Var(sizeValue{&o.maxBody}, "max-body", "largest request body fingerprinted, in `BYTES`; larger gets 413")
	fs.Var(sizeValue{&o.maxResponse}, "max-response", "largest answer stored, in `BYTES`; larger is delivered once, not replayable")
	fs.StringVar(&o.cache, "cache", "", "replay cache `URL` in front of the store: redis://…, redis+cluster://…, redis+sentinel://… or memory: (in-process LRU); off by default")
	o.keyring.register(fs)
	o.keyring.registerRequired(fs)
	fs.Var(fieldsValue{&o.redact}, "redact-json-fields", "comma-separated JSON member `PATHS` (token,card.number) removed from stored bodies: replays lack them, the first answer has them")
	fs.BoolVar(&o.async, "async", o.async, "answer a retry of a request still in progress 202 Accepted with Retry-After instead of 409 key-in-use")
	fs.Var(problemBaseValue{&o.problemBase}, "problem-base-uri", "`URI` the problem code is appended to, to form a problem+json \"type\"")
	fs.Var(routesValue{&o.metricsRoutes}, "metrics-routes", "comma-separated route `PATTERNS` (http.ServeMux syntax: POST /v1/reset/{token}) the metrics label requests by; a request no pattern matches is labelled by --metrics-path-segments")
	fs.Var(nonNegativeIntValue{&o.metricsSegments}, "metrics-path-segments", "leading path segments `N` in the metrics label of a request no --metrics-routes pattern matches (0: the method alone, \"POST /*\"); never more than carry no identifier or secret")
	o.guards.register(fs)
	o.ops.register(fs)
	fs.BoolVar(&o.maintain, "maintain", o.maintain, "also run the maintainer of 'idem maintain' (sweeper, reaper and, with --reconcile-url, reconciler) in this process")
	o.reconcile.register(fs)
	if err := fs.parse(args, e); err != nil {
		return nil, err
	}
	if err := o.reconcile.check(o.maintain, o.scopeHeader); err != nil {
		return nil, err
	}
	if err := o.keyring.check(); err != nil {
		return nil, err
	}
	if o.upstream == nil {
		return nil, usageErrorf("--upstream (or %s) is required", envName("upstream"))
	}
	if len(o.methods) == 0 {
		o.methods = idem.DefaultMethods(idem.Profile(o.profile))
	}
	return o, nil
}

// problemBaseValue is a URI with a scheme (https://…, urn:…).
type problemBaseValue struct{ p *string }

func (v problemBaseValue) String() string {
	if v.p == nil {
		return ""
	}
	return *v.p
}

func (v problemBaseValue) Set(s string) error {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return errors.New("want a URI with a scheme, such as https://api.example.com/problems/")
	}
	*v.p = s
	return nil
}

// storeValue is a store URL whose scheme names a store.
type storeValue struct{ p *string }

func (v storeValue) String() string {
	if v.p == nil {
		return ""
	}
	return storeurl.Redact(*v.p)
}

func (v storeValue) Set(s string) error {
	if storeurl.Kind(s) == "" {
		return errors.New("want sqlite:PATH, memory:, postgres://…, mysql://… or redis://…")
	}
	*v.p = s
	return nil
}

// config maps the options onto the middleware's configuration.
func (o *proxyOptions) config(e *env) *idem.Config {
	cfg := &idem.Config{
		Methods:     o.methods,
		RequireKey:  o.requireKey,
		GuardConfig: idem.GuardConfig{TTL: o.ttl, Lease: o.lease, Wait: o.wait, MaxResponse: o.maxResponse, Logger: e.logger},

		Profile: idem.Profile(o.profile),
		MaxBody: o.maxBody,

		Async:          o.async,
		ProblemBaseURI: o.problemBase,

		// The upstream routes on the path as sent, so /a%2Fb and /a/b are
		// different endpoints, as they may be different resources.
		Endpoint: idem.EscapedPathEndpoint(),
	}
	cfg.MetricsEndpoint = metricsEndpoint(o.metricsRoutes, o.metricsSegments)
	if o.scopeHeader != "" {
		cfg.Scope = scopeFromHeader(o.scopeHeader)
	}
	if len(o.redact) > 0 {
		cfg.Redact = idem.RedactJSONFields(o.redact...)
	}
	o.guards.apply(cfg)
	return cfg
}

// metricsEndpoint returns the proxy's idem.Config.MetricsEndpoint: the
// method and the first pattern of routes the request matches, else the
// method and the path's first segments segments. The records themselves
// stay named by the raw path: the upstream routes on it.
func metricsEndpoint(routes *http.ServeMux, segments int) func(*http.Request) string {
	byPath := idem.MetricsPathPrefix(segments)
	return func(r *http.Request) string {
		if routes != nil {
			if _, pattern := routes.Handler(r); pattern != "" {
				if i := strings.IndexByte(pattern, ' '); i > 0 && !strings.ContainsRune(pattern[:i], '/') {
					return pattern
				}
				return r.Method + " " + pattern
			}
		}
		return byPath(r)
	}
}

// routesValue is a comma-separated list of http.ServeMux patterns, kept
// as a mux that matches them.
type routesValue struct{ p **http.ServeMux }

func (v routesValue) String() string { return "" }

func (v routesValue) Set(s string) (err error) {
	mux := http.NewServeMux()
	defer func() {
		// ServeMux panics on an invalid or conflicting pattern.
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	for pattern := range strings.SplitSeq(s, ",") {
		if pattern = strings.TrimSpace(pattern); pattern != "" {
			mux.Handle(pattern, http.NotFoundHandler())
		}
	}
	*v.p = mux
	return nil
}

// nonNegativeIntValue is a whole number of at least 0.
type nonNegativeIntValue struct{ p *int }

func (v nonNegativeIntValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.Itoa(*v.p)
}

func (v nonNegativeIntValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || n < 0 || strconv.Itoa(n) != s {
		return errors.New("want a whole number of at least 0")
	}
	*v.p = n
	return nil
}

// errNoScope is the logged cause of the 401 for a request without the scope
// header, or with only empty or blank values of it; the client sees the middleware's generic problem.
var errNoScope = errors.New("the scope header is missing")

// scopeFromHeader returns an idem.Config.Scope that takes the scope from the
// header name: the hex SHA-256 of its value, so the value (often a
// credential) is never stored or logged. Several field lines are joined with
// ", ", as RFC 9110 §5.3 combines them.
//
// A covered request with an Idempotency-Key but without the header, or
// with only empty or blank values of it, is answered 401 problem+json (code "unauthorized") rather than given the
// scope of the empty value: clients that forgot their credential must not
// share one key space in which they could replay each other's answers.
// Requests the middleware does not protect (other methods, no key) are
// forwarded whatever their headers; the upstream does its own
// authentication.
func scopeFromHeader(name string) func(*http.Request) (string, error) {
	return func(r *http.Request) (string, error) {
		values := r.Header.Values(name)
		if !slices.ContainsFunc(values, func(v string) bool { return strings.TrimSpace(v) != "" }) {
			return "", errNoScope
		}
		return scopeOf(strings.Join(values, ", ")), nil
	}
}

// scopeOf is the scope the proxy stores for a scope header's value: its hex
// SHA-256. `idem keys --tenant-header-value` uses it to find a tenant's
// records.
func scopeOf(headerValue string) string {
	sum := sha256.Sum256([]byte(headerValue))
	return hex.EncodeToString(sum[:])
}

func runProxy(ctx context.Context, e *env, args []string) (err error) {
	o, err := parseProxy(args, e)
	if err != nil {
		return err
	}
	keyring, err := o.keyring.load(e)
	if err != nil {
		return err
	}
	store, closeStore, err := storeurl.Open(ctx, o.store)
	if err != nil {
		return fmt.Errorf("opening the store: %w", err)
	}
	defer func() {
		if cerr := closeStore(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing the store: %w", cerr))
		}
	}()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return err
	}
	var maint *idemmaint.Maintainer // nil without --maintain
	if o.maintain {
		// Stopped before the store is closed (defers run last first).
		mcfg := maintainerConfig(e, 0, 0, 0)
		def := defaultGrace(o.lease)
		o.reconcile.apply(e, mcfg, o.maxResponse, def)
		if g := o.reconcile.graceOr(def); o.reconcile.tmpl != nil && g < def {
			e.logger.Warn("idem proxy: --reconcile-grace is shorter than the upstream timeout or the lease: the reconciler may ask about a request the upstream is still to act on, and release it for a second run",
				"grace", g, "upstream_timeout", proxy.DefaultTimeout, "lease", o.lease)
		}
		// The reconciler stores the answers it finds: sealed, as the
		// middleware's.
		maint = idemmaint.New(idemcrypt.New(store, keyring), mcfg)
		if err := maint.Start(ctx); err != nil {
			ln.Close()
			return err
		}
		defer maint.Stop()
	}
	masters := mastersOf(store) // before the cache hides the store
	store, closeCache, err := openCache(ctx, o.cache, store, e.logger)
	if err != nil {
		ln.Close()
		return err
	}
	defer closeCache()
	// The console reads and resolves records: through the keyring too.
	opsHandler, err := newOps(&o.ops, opsParts{Store: idemcrypt.New(store, keyring), Masters: masters, Maintainer: maint, Logger: e.logger, TenantLabel: o.guards.tenantLabel})
	if err != nil {
		ln.Close()
		return err
	}
	opsCtx, stopOps := context.WithCancel(ctx)
	waitOps, err := startOps(opsCtx, e, &o.ops, opsHandler)
	if err != nil {
		stopOps()
		ln.Close()
		return err
	}
	defer waitOps()
	defer stopOps()
	cfg := o.config(e)
	cfg.Metrics = opsHandler.Metrics
	cfg.Keyring = keyring
	cfg.EncryptionRequired = o.keyring.required
	upstream := proxy.New(o.upstream, &proxy.Config{ProblemTypeBase: o.problemBase, Logger: e.logger,
		StripeErrors: o.profile == string(idem.ProfileStripe)})
	defer upstream.CloseIdleConnections()
	e.logger.Info("listening",
		"addr", ln.Addr().String(),
		"upstream", storeurl.Redact(o.upstream.String()),
		"store", storeurl.Kind(o.store),
		"store_url", storeurl.Redact(o.store),
		"profile", o.profile,
		"methods", strings.Join(o.methods, ","),
		"scope_header", o.scopeHeader,
		"maintain", o.maintain,
		"cache", storeurl.Redact(o.cache),
		"encryption_keys", keyNames(keyring),
		"redact_json_fields", strings.Join(o.redact, ","),
	)
	return serveWith(ctx, e, ln, idem.New(store, cfg)(upstream), o.guards.bodyTimeout, o.middlewareReads())
}

// middlewareReads returns the function that reports whether the
// middleware reads a request's body itself, under its own read deadline
// (Config.BodyTimeout, the same bound as the server's): a covered method,
// compared as the middleware compares it, with an Idempotency-Key. The
// middleware may still refuse such a request before its body (a key it
// does not accept); bodyDeadline bounds the rest of the body then.
func (o *proxyOptions) middlewareReads() func(*http.Request) bool {
	methods := make([]string, len(o.methods))
	for i, m := range o.methods {
		methods[i] = strings.ToUpper(m)
	}
	return func(r *http.Request) bool {
		return len(r.Header[idem.HeaderKey]) > 0 && slices.Contains(methods, r.Method)
	}
}
