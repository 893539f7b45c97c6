package console

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Defaults of the Config fields.
const (
	DefaultPrefix     = "/_idem"
	DefaultSessionTTL = 12 * time.Hour
	DefaultCountLimit = 10000
	DefaultPageSize   = 50
	// MinTokenLength is the shortest console token New accepts.
	MinTokenLength = 16
)

// Stat is one figure shown on the overview, e.g. the maintainer's unknown
// backlog; Warn highlights it.
type Stat struct {
	Name  string
	Value string
	Warn  bool
}

// Config configures the console. Store and Token are required.
type Config struct {
	// Store is the idempotency store the console reads and resolves.
	Store idemstore.Store
	// Masters, when set, names the servers over which the store spreads
	// its records (the masters of a Redis Cluster); the overview says its
	// counts cover every one of them. Defaults to nil: one server.
	Masters func(ctx context.Context) ([]string, error)
	// Token is the console's secret; it must be at least MinTokenLength
	// bytes (generate 32 random bytes). It authenticates operators and keys
	// the HMACs of the CSRF tokens and the sealing of references.
	Token string
	// Prefix is the path the console is mounted at, without a trailing
	// slash; the handler serves Prefix+"/" and everything below it, without
	// http.StripPrefix. Defaults to "/_idem".
	Prefix string
	// Outbox, when set, enables the outbox pages. Defaults to nil: the pages
	// say there is no outbox.
	Outbox Outbox
	// Ledger, when set, enables the page of the payments ledger's
	// discrepancies. Defaults to nil: the page says there is no ledger.
	Ledger Ledger
	// Stats, when set, returns figures for the overview (the maintainer's
	// unknown backlog, oldest in-progress lease, …). It is called once per
	// overview. Defaults to nil.
	Stats func(ctx context.Context) []Stat
	// Decisions, when set, returns the middleware's decision totals since the
	// process started (idemprom.Metrics.DecisionTotals): the overview shows
	// them and their rates between views. Defaults to nil.
	Decisions func() map[string]float64
	// Trends, when set, is the in-process memory of the last hour the
	// overview charts (decisions per minute, outbox depth and dead letters,
	// unknown backlog) and GET Prefix+"/trends.json" serves; its owner feeds
	// it (Trends.Run with Collect). Its recent observations also give the
	// decision rates a sliding window. Defaults to nil: no charts.
	Trends *Trends
	// TrustedOrigins are origins ("https://ops.example.com") besides the
	// request's own host from which POSTs are accepted, for a console
	// behind a proxy that rewrites Host. Defaults to none.
	TrustedOrigins []string
	// SessionTTL is how long a login lasts. Defaults to 12 hours.
	SessionTTL time.Duration
	// SecureCookie sets the Secure attribute on the session cookie even when
	// the request did not arrive over TLS (TLS terminated by a proxy that
	// does not say so). Defaults to false: Secure is set when the request
	// came over TLS, or a proxy says it did (X-Forwarded-Proto: https or
	// Forwarded: proto=https).
	SecureCookie bool
	// CountLimit bounds the records counted per state on the overview;
	// beyond it the count shows as "N+". Defaults to 10000.
	CountLimit int
	// PageSize is the number of rows per page of the lists. Defaults to 50.
	PageSize int
	// MaxLoginFailures bounds the failed authentications (form logins and
	// wrong Authorization: Bearer tokens) per client address and per minute;
	// beyond it that address gets 429 until its minute is over, even with
	// the right token. Other addresses are not affected. Behind a reverse
	// proxy every client shares the proxy's address. Defaults to 10.
	MaxLoginFailures int
	// Now is the clock (session expiry, ages). Defaults to time.Now.
	Now func() time.Time
	// Logger receives the audit lines and errors. Records are named by
	// key_hash, never by key. Defaults to slog.Default().
	Logger *slog.Logger
}

// withDefaults returns a copy of cfg with every zero field set to its
// default. It is the only place defaults are applied.
func (cfg Config) withDefaults() Config {
	c := cfg
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	c.Prefix = "/" + strings.Trim(c.Prefix, "/")
	if c.SessionTTL <= 0 {
		c.SessionTTL = DefaultSessionTTL
	}
	if c.CountLimit <= 0 {
		c.CountLimit = DefaultCountLimit
	}
	if c.PageSize <= 0 {
		c.PageSize = DefaultPageSize
	}
	if c.MaxLoginFailures <= 0 {
		c.MaxLoginFailures = 10
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// ErrNoToken is returned by New without a token: no token, no console.
var ErrNoToken = errors.New("console: a token is required (no token, no console)")

// console is the handler New returns.
type console struct {
	cfg   Config
	keys  keys
	cop   *http.CrossOriginProtection
	mux   *http.ServeMux
	rates rateTracker

	failures failureLimiter // failed logins and bearer tokens per client address
	sessions sessions       // the signed-in operators' cookies
}

// New returns the console's handler, to be mounted at cfg.Prefix+"/" (by
// default "/_idem/"). It returns ErrNoToken without a token, and an error
// for a token shorter than MinTokenLength or a nil Store.
func New(cfg Config) (http.Handler, error) {
	switch {
	case cfg.Token == "":
		return nil, ErrNoToken
	case len(cfg.Token) < MinTokenLength:
		return nil, fmt.Errorf("console: the token must be at least %d bytes", MinTokenLength)
	case cfg.Store == nil:
		return nil, errors.New("console: a store is required")
	}
	c := &console{cfg: cfg.withDefaults(), keys: deriveKeys(cfg.Token)}
	c.failures.max = c.cfg.MaxLoginFailures
	c.cop = http.NewCrossOriginProtection()
	for _, o := range c.cfg.TrustedOrigins {
		if err := c.cop.AddTrustedOrigin(o); err != nil {
			return nil, fmt.Errorf("console: trusted origin: %w", err)
		}
	}
	// Rejections by the cross-origin check are answered by forbidden.
	c.cop.SetDenyHandler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.forbidden(w, r, "This request came from another site.")
	}))
	p := c.cfg.Prefix
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+p+"/{$}", c.overview)
	mux.HandleFunc("GET "+p+"/trends.json", c.trendsJSON)
	mux.HandleFunc("GET "+p+"/unknown", c.unknownQueue)
	mux.HandleFunc("GET "+p+"/keys", c.keyList)
	mux.HandleFunc("GET "+p+"/key", c.keyPage)
	mux.HandleFunc("POST "+p+"/key/resolve", c.resolve)
	mux.HandleFunc("GET "+p+"/outbox", c.outboxPage)
	mux.HandleFunc("POST "+p+"/outbox/retry", c.outboxRetry)
	mux.HandleFunc("GET "+p+"/ledger", c.ledgerPage)
	mux.HandleFunc("POST "+p+"/ledger/resolve", c.ledgerResolve)
	mux.HandleFunc("POST "+p+"/logout", c.logout)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		c.renderError(w, r, http.StatusNotFound, "Not found", "There is no such page in the console.")
	})
	c.mux = mux
	return c, nil
}

// ServeHTTP authenticates every request (except the login form itself),
// checks the origin and CSRF token of every POST, and routes it.
func (c *console) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	securityHeaders(w.Header())
	if r.URL.Path == c.cfg.Prefix+"/login" {
		c.login(w, r)
		return
	}
	bearer := r.Header.Get("Authorization") != ""
	if bearer {
		// A bearer token is a guess like a form login, under the same limit.
		if ok, retry := c.failures.allowed(clientAddr(r.RemoteAddr), c.cfg.Now()); !ok {
			w.Header().Set("Retry-After", strconv.Itoa(retry))
			c.renderError(w, r, http.StatusTooManyRequests, "Too many requests", "Too many failed authentications: wait a minute.")
			return
		}
	}
	sess, ok := c.authenticate(r)
	if !ok {
		if bearer {
			c.authFailed(r, "bearer")
		}
		c.unauthorized(w, r, "")
		return
	}
	r = r.WithContext(context.WithValue(r.Context(), sessionKey{}, sess))
	if r.Method == http.MethodPost {
		if err := c.cop.Check(r); err != nil {
			c.forbidden(w, r, "This request came from another site.")
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			c.renderError(w, r, http.StatusBadRequest, "Bad request", "The form could not be read (too large?).")
			return
		}
		if !c.keys.checkCSRF(sess, r.PostForm.Get("csrf")) {
			c.forbidden(w, r, "The form's CSRF token is missing or wrong. Reload the page and try again.")
			return
		}
	}
	c.mux.ServeHTTP(w, r)
}

// maxFormBytes bounds a POSTed form (the largest is a resolution with the
// response body the operator enters).
const maxFormBytes = 2 << 20

// securityHeaders sets the headers every console response carries.
func securityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", csp)
	h.Set("Cache-Control", "no-store")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Cross-Origin-Opener-Policy", "same-origin")
}
