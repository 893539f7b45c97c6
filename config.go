package idem

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/idem-dev/idem/idemcrypt"
)

// Profile selects how the middleware words the answers that differ between
// published idempotency designs.
type Profile string

const (
	// ProfileIETF follows draft-ietf-httpapi-idempotency-key-header: 422 on a
	// key reused with another request, 5xx releases the key. The default.
	ProfileIETF Profile = "ietf"
	// ProfileStripe answers a reused key with 400 and stores 5xx responses
	// once the handler ran, as Stripe documents.
	ProfileStripe Profile = "stripe"
	// ProfileAppstrate answers a reused key with 409 and code "conflict".
	ProfileAppstrate Profile = "appstrate"
)

// DefaultProblemBaseURI is the default of Config.ProblemBaseURI: a problem's
// "type" is this followed by its code, an anchor of the README's table of
// problems (https://github.com/idem-dev/idem#problem-key-reused).
const DefaultProblemBaseURI = "https://github.com/idem-dev/idem#problem-"

// DefaultMethods returns the methods a profile covers by default: POST and
// PATCH, and with ProfileAppstrate, whose documentation covers every write,
// POST, PUT, PATCH and DELETE.
func DefaultMethods(p Profile) []string {
	if p == ProfileAppstrate {
		return []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}
	}
	return []string{http.MethodPost, http.MethodPatch}
}

// DefaultBodyTimeout is the default of Config.BodyTimeout.
const DefaultBodyTimeout = 60 * time.Second

// DefaultStoredHeaders returns the default allow-list of response headers
// stored for replay, a fresh slice on every call: no caller can change the
// default of the others.
func DefaultStoredHeaders() []string {
	return []string{
		"Content-Type", "Content-Encoding", "Content-Language", "Content-Location",
		"Location", "ETag", "Last-Modified",
	}
}

// GuardConfig configures the core every adapter shares: NewGuard (and Do
// on it), the HTTP middleware (Config embeds it), idemgrpc's interceptors
// and the message consumers. A nil *GuardConfig, like its zero value, means
// all defaults.
type GuardConfig struct {
	// MinKeyLength rejects shorter keys (400 key-invalid over HTTP,
	// ErrKeyInvalid from a Guard). Defaults to 1.
	MinKeyLength int
	// TTL is how long a record is kept. Defaults to 24 hours.
	TTL time.Duration
	// Lease is the in-progress lock length; the lease is renewed every
	// Lease/3 while the operation runs. Defaults to 30 seconds.
	Lease time.Duration
	// LeaseMargin is how long before the end of its lease an attempt whose
	// lease was not renewed gives it up: its context is cancelled with cause
	// ErrLeaseLost, and CheckLease fails from then on. The end is counted on
	// Clock from the moment the last reservation or renewal that succeeded
	// was sent. The margin must cover the time between an operation's last
	// CheckLease and the effect it guards, and the difference between this
	// process's clock and the clocks of the other processes that decide on
	// the store's leases (their sweepers and reservations). Defaults to
	// Lease/6; at most Lease/2.
	LeaseMargin time.Duration
	// Wait, when positive, makes a call that finds its key in progress
	// block up to Wait for the result instead of answering at once (409
	// over HTTP, ErrInProgress from a Guard). Defaults to 0.
	Wait time.Duration
	// MaxResponse is the largest result body stored; a larger one is
	// delivered once and its record marked not replayable. Defaults to
	// 1 MiB.
	MaxResponse int64
	// Keyring, when set, encrypts every stored response (header values and
	// body) at rest with AES-256-GCM under its first key, and opens
	// responses sealed under any of its keys (package idemcrypt). A record
	// sealed under a key it does not hold is answered 503
	// store-unavailable (ErrStoreUnavailable), never replayed and never run
	// again, not even with FailOpen; one whose seal does not open is
	// answered 500 response-untrusted (ErrResponseUntrusted). Without a
	// Keyring, responses are stored in the clear and a sealed record is
	// answered 503 the same way. Defaults to none.
	Keyring *idemcrypt.Keyring
	// EncryptionRequired refuses to replay a stored response that is not
	// sealed in the current format: one stored in the clear (which anyone
	// who can write to the store can plant) or sealed by idemcrypt's format
	// v1 (not bound to the record's fingerprint and creation time). Such a
	// record is answered 500 response-untrusted and its request is never
	// run again (not even with FailOpen). Turn it on once `idem keys
	// rotate-encryption` (idemcrypt.Rotate) has sealed every record. It
	// needs a Keyring. Defaults to false: such records replay as stored.
	EncryptionRequired bool
	// StoreTimeout bounds every store call; a call that takes longer is a
	// store outage (503 before the operation runs, a logged failure after
	// it). Defaults to 2 seconds.
	StoreTimeout time.Duration
	// MaxInProgressPerScope, when positive, refuses a new key (429
	// too-many-keys) when the scope already has that many calls in progress
	// in this process. Defaults to 0 (no limit).
	MaxInProgressPerScope int
	// NewKeysPerSecondPerScope, when positive, limits the rate of new keys
	// per scope in this process (burst of the same size); over it the answer
	// is 429 too-many-keys and nothing is stored. Defaults to 0 (no limit).
	NewKeysPerSecondPerScope float64
	// Transactional runs the operation in transactional mode (SPEC section
	// 5). The store must implement idemstore.TxStore (idemsqlite, idempgx,
	// idemmysql, idemmem); New and NewGuard panic otherwise. The operation
	// gets the business transaction from its context
	// (idemsqlite.TxFromContext, idempgx.TxFromContext,
	// idemmysql.TxFromContext, idemmem.TxFromContext); the key's completion
	// is written in that transaction, which is committed before the answer
	// is sent. A failure (over HTTP: a 5xx, 408, 425 or 429 answer), a panic
	// or a lost lease rolls it back and releases the key; an expired lease
	// also releases the key, since nothing was committed. Phased operations
	// (RunPhases) need it. Defaults to false.
	Transactional bool
	// FailOpen runs the operation unprotected when the store is
	// unavailable. For development only: it logs an error on every bypass.
	// Defaults to false (fail closed: 503 store-unavailable,
	// ErrStoreUnavailable).
	FailOpen bool
	// Metrics receives a count of every decision and the store latencies.
	// Defaults to none.
	Metrics Metrics
	// Tracer starts spans around reserve, operation and completion.
	// Defaults to none.
	Tracer Tracer
	// Logger receives the logs. Keys appear only as hashes. Defaults to
	// slog.Default().
	Logger *slog.Logger
	// Clock is the clock of every time decision: the deadlines of store
	// calls (StoreTimeout), lease renewals (every Lease/3), the lease's end
	// (LeaseMargin), waits (Wait), Retry-After and the per-scope key rate.
	// Tests pass an *idemtest.Clock and move time with its Advance instead
	// of sleeping. Defaults to the wall clock.
	Clock Clock
}

// Config configures the HTTP middleware: the core's settings, embedded as
// GuardConfig, and those that concern HTTP. A nil *Config means all
// defaults. Routes that need other settings (a required key, another TTL, a
// narrowed fingerprint) get their own middleware instance on the same store.
type Config struct {
	// GuardConfig holds the settings of the core: TTL, Lease, Wait,
	// Keyring, Transactional, Metrics, Logger, Clock and the others. Its
	// zero value means the core's defaults.
	GuardConfig
	// Methods are the covered methods; others pass through untouched.
	// Defaults to DefaultMethods(Profile): POST and PATCH, and with
	// ProfileAppstrate POST, PUT, PATCH and DELETE.
	Methods []string
	// RequireKey answers 400 key-missing to a covered request without the
	// header. Defaults to false: such requests pass through unprotected.
	RequireKey bool
	// Scope returns the tenant or principal of the request, from
	// authentication, never from the body. An error answers 401 with the
	// error's text withheld. Defaults to a single empty scope.
	Scope func(r *http.Request) (string, error)
	// Endpoint names the operation. Defaults to r.Pattern when the
	// http.ServeMux matched one (prefixed with the method when the pattern
	// has none), else the method and the URL path.
	Endpoint func(r *http.Request) string
	// MetricsEndpoint names the request's endpoint in Metrics (the endpoint
	// label of idem_decisions_total and idem_response_stored_bytes in
	// idemprom). A raw path may carry identifiers and secrets
	// (/v1/reset/TOKEN) and makes one series per value, so it is never the
	// label unless this says so. Defaults to the endpoint when it is a
	// route pattern (r.Pattern) or comes from Endpoint, and otherwise (an
	// unrouted request named by its path) to the method alone:
	// MetricsPathPrefix(0), "POST /*". MetricsPathPrefix keeps leading
	// segments of the path.
	MetricsEndpoint func(r *http.Request) string
	// Fingerprint narrows the request fingerprint for JSON bodies.
	// Defaults to the whole body.
	Fingerprint FingerprintConfig
	// Async answers an in-progress duplicate with 202 Accepted and
	// Retry-After instead of 409, for routes that process asynchronously.
	// Defaults to false.
	Async bool
	// Profile selects the answer to key reuse and the 5xx policy.
	// Defaults to ProfileIETF.
	Profile Profile
	// MaxBody is the largest request body fingerprinted; larger bodies get
	// 413 body-too-large before anything is stored. Defaults to 1 MiB.
	MaxBody int64
	// BodyTimeout bounds how long the client may take to send the body of
	// a covered request with a key, from the moment the middleware starts
	// reading it. A body still arriving then gets 408 body-timeout and
	// nothing is stored: the key is reserved only once the whole body is
	// in, so a slow body never holds it in progress. The bound is a read
	// deadline on the connection (http.ResponseController), which net/http's
	// HTTP/1 and HTTP/2 servers support; with a ResponseWriter that does not,
	// the body is not bounded. Defaults to 60 seconds.
	BodyTimeout time.Duration
	// StoredHeaders is the allow-list of response headers stored for replay.
	// Set-Cookie, Authorization and hop-by-hop headers are never stored,
	// whatever the list says. Defaults to DefaultStoredHeaders().
	StoredHeaders []string
	// Redact, when set, returns the body to store for replay in place of
	// body (status and header are those stored; body must not be
	// modified). It changes what a replay returns: the first answer is
	// sent unredacted, every replay gets the redacted body. See
	// RedactJSONFields. Defaults to storing the body as sent.
	Redact func(r *http.Request, status int, header http.Header, body []byte) []byte
	// ProblemBaseURI prefixes the problem code to form the problem+json
	// "type" URI. Defaults to DefaultProblemBaseURI, whose URIs lead to the
	// README's description of each problem.
	ProblemBaseURI string
}

// Clock tells the time and runs functions after a while on it; the
// middleware and Guard take one as Config.Clock. *idemtest.Clock implements it.
type Clock interface {
	// Now returns the clock's current time.
	Now() time.Time
	// AfterFunc calls f once d has passed on the clock, unless stop is
	// called first; stop reports whether it prevented the call. It must not
	// call f before it returns. The functions idem passes return at once,
	// so a test clock may call them on the goroutine that moves it.
	// time.AfterFunc(d, f).Stop is the wall clock's.
	AfterFunc(d time.Duration, f func()) (stop func() bool)
}

// FingerprintConfig narrows the fingerprint of JSON bodies to selected
// top-level members or drops members, e.g. a client timestamp.
type FingerprintConfig struct {
	// Include, when not empty, keeps only these top-level members.
	// Defaults to none: every member is kept.
	Include []string
	// Exclude drops these top-level members. Defaults to none.
	Exclude []string
}

func (c *GuardConfig) withDefaults() GuardConfig {
	var cfg GuardConfig
	if c != nil {
		cfg = *c
	}
	if cfg.MinKeyLength <= 0 {
		cfg.MinKeyLength = 1
	}
	if cfg.TTL <= 0 {
		cfg.TTL = 24 * time.Hour
	}
	if cfg.Lease <= 0 {
		cfg.Lease = 30 * time.Second
	}
	if cfg.LeaseMargin <= 0 {
		cfg.LeaseMargin = cfg.Lease / 6
	}
	cfg.LeaseMargin = min(cfg.LeaseMargin, cfg.Lease/2)
	if cfg.MaxResponse <= 0 {
		cfg.MaxResponse = 1 << 20
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = 2 * time.Second
	}
	if cfg.Metrics == nil {
		cfg.Metrics = nopMetrics{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return cfg
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	cfg.GuardConfig = cfg.GuardConfig.withDefaults()
	if len(cfg.Methods) == 0 {
		cfg.Methods = DefaultMethods(cfg.Profile)
	}
	if cfg.Profile == "" {
		cfg.Profile = ProfileIETF
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.StoredHeaders == nil {
		cfg.StoredHeaders = DefaultStoredHeaders()
	}
	if cfg.ProblemBaseURI == "" {
		cfg.ProblemBaseURI = DefaultProblemBaseURI
	}
	return cfg
}
