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

// Config configures the middleware. A nil *Config means all defaults. Routes
// that need other settings (a required key, another TTL, a narrowed
// fingerprint) get their own middleware instance on the same store.
type Config struct {
	// Methods are the covered methods; others pass through untouched.
	// Defaults to DefaultMethods(Profile): POST and PATCH, and with
	// ProfileAppstrate POST, PUT, PATCH and DELETE.
	Methods []string
	// RequireKey answers 400 key-missing to a covered request without the
	// header. Defaults to false: such requests pass through unprotected.
	RequireKey bool
	// MinKeyLength rejects shorter keys with 400 key-invalid. Defaults to 1.
	MinKeyLength int
	// Scope returns the tenant or principal of the request, from
	// authentication, never from the body. An error answers 401 with the
	// error's text withheld. Defaults to a single empty scope.
	Scope func(r *http.Request) (string, error)
	// Endpoint names the operation. Defaults to r.Pattern when the
	// http.ServeMux matched one (prefixed with the method when the pattern
	// has none), else the method and the URL path.
	Endpoint func(r *http.Request) string
	// Fingerprint narrows the request fingerprint for JSON bodies.
	Fingerprint FingerprintConfig
	// TTL is how long a record is kept. Defaults to 24 hours.
	TTL time.Duration
	// Lease is the in-progress lock length; the lease is renewed every
	// Lease/3 while the handler runs. Defaults to 30 seconds.
	Lease time.Duration
	// LeaseMargin is how long before the end of its lease an attempt whose
	// lease was not renewed gives it up: its handler's context is cancelled
	// with cause ErrLeaseLost, and CheckLease fails from then on. The end
	// is counted on Clock from the moment the last reservation or renewal
	// that succeeded was sent. The margin must cover the time between a
	// handler's last CheckLease and the effect it guards, and the
	// difference between this process's clock and the clocks of the other
	// processes that decide on the store's leases (their sweepers and
	// reservations). Defaults to Lease/6; at most Lease/2.
	LeaseMargin time.Duration
	// Wait, when positive, makes a request that finds its key in progress
	// block up to Wait for the result instead of answering 409 at once.
	// Defaults to 0.
	Wait time.Duration
	// Async answers an in-progress duplicate with 202 Accepted and
	// Retry-After instead of 409, for routes that process asynchronously.
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
	// MaxResponse is the largest response body stored; a larger response is
	// delivered once and marked not replayable. Defaults to 1 MiB.
	MaxResponse int64
	// StoredHeaders is the allow-list of response headers stored for replay.
	// Set-Cookie, Authorization and hop-by-hop headers are never stored,
	// whatever the list says. Defaults to DefaultStoredHeaders().
	StoredHeaders []string
	// Keyring, when set, encrypts every stored response (header values and
	// body) at rest with AES-256-GCM under its first key, and opens
	// responses sealed under any of its keys (package idemcrypt). A record
	// sealed under a key it does not hold is answered 503
	// store-unavailable, never replayed. Without a Keyring, responses are
	// stored in the clear and a sealed record is answered the same way.
	// Defaults to none.
	Keyring *idemcrypt.Keyring
	// Redact, when set, returns the body to store for replay in place of
	// body (status and header are those stored; body must not be
	// modified). It changes what a replay returns: the first answer is
	// sent unredacted, every replay gets the redacted body. See
	// RedactJSONFields. Defaults to storing the body as sent.
	Redact func(r *http.Request, status int, header http.Header, body []byte) []byte
	// StoreTimeout bounds every store call; a call that takes longer is a
	// store outage (503 before the handler, a logged failure after it).
	// Defaults to 2 seconds.
	StoreTimeout time.Duration
	// ProblemBaseURI prefixes the problem code to form the problem+json
	// "type" URI. Defaults to DefaultProblemBaseURI, whose URIs lead to the
	// README's description of each problem.
	ProblemBaseURI string
	// ProblemTypeBase is the former name of ProblemBaseURI, used when
	// ProblemBaseURI is empty.
	//
	// Deprecated: use ProblemBaseURI.
	ProblemTypeBase string
	// MaxInProgressPerScope, when positive, answers 429 too-many-keys to a
	// new key when the scope already has that many requests in progress in
	// this process. Defaults to 0 (no limit).
	MaxInProgressPerScope int
	// NewKeysPerSecondPerScope, when positive, limits the rate of new keys
	// per scope in this process (burst of the same size); over it the answer
	// is 429 too-many-keys and nothing is stored. Defaults to 0 (no limit).
	NewKeysPerSecondPerScope float64
	// Transactional runs the route in transactional mode (SPEC section 5).
	// The store must implement idemstore.TxStore (idemsqlite, idempgx,
	// idemmem); New panics otherwise. The handler gets the business
	// transaction from the request context (idemsqlite.TxFromContext,
	// idempgx.TxFromContext, idemmem.TxFromContext); the
	// key's completion is written in that transaction, which the middleware
	// commits before it sends the response. A 5xx, 408, 425 or 429 answer, a
	// panic or a lost lease rolls it back and releases the key; an expired
	// lease also releases the key, since nothing was committed. Phased
	// operations (RunPhases) need it. Defaults to false.
	Transactional bool
	// FailOpen runs the handler unprotected when the store is unavailable.
	// For development only: it logs an error on every bypass. Defaults to
	// false (fail closed with 503 store-unavailable).
	FailOpen bool
	// Metrics receives a count of every decision and the store latencies.
	// Defaults to none.
	Metrics Metrics
	// Tracer starts spans around reserve, handler and completion.
	// Defaults to none.
	Tracer Tracer
	// Logger receives the middleware's logs. Keys appear only as hashes.
	// Defaults to slog.Default().
	Logger *slog.Logger
	// Clock is the clock of every time decision the middleware (or a
	// Guard) makes: the deadlines of store calls (StoreTimeout), lease renewals (every
	// Lease/3), the lease's end (LeaseMargin), waits (Wait), Retry-After and the per-scope key rate. Tests
	// pass an *idemtest.Clock and move time with its Advance instead of
	// sleeping. Defaults to the wall clock, read through Now.
	Clock Clock
	// Now, when Clock is nil, is read for Retry-After and the per-scope key
	// rate; deadlines, lease renewals and waits then run on the wall clock.
	// It is ignored when Clock is set. Defaults to time.Now.
	Now func() time.Time
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
	Include []string
	// Exclude drops these top-level members.
	Exclude []string
}

func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if len(cfg.Methods) == 0 {
		cfg.Methods = DefaultMethods(cfg.Profile)
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
	if cfg.Profile == "" {
		cfg.Profile = ProfileIETF
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.BodyTimeout <= 0 {
		cfg.BodyTimeout = DefaultBodyTimeout
	}
	if cfg.MaxResponse <= 0 {
		cfg.MaxResponse = 1 << 20
	}
	if cfg.StoredHeaders == nil {
		cfg.StoredHeaders = DefaultStoredHeaders()
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = 2 * time.Second
	}
	if cfg.ProblemBaseURI == "" {
		cfg.ProblemBaseURI = cfg.ProblemTypeBase
	}
	if cfg.ProblemBaseURI == "" {
		cfg.ProblemBaseURI = DefaultProblemBaseURI
	}
	if cfg.Metrics == nil {
		cfg.Metrics = nopMetrics{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Clock != nil {
		cfg.Now = cfg.Clock.Now
	} else if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}
