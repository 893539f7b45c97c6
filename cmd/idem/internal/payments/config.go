package payments

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"time"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcrypt"
	"github.com/idem-dev/idem/outbox"
)

// Default values of the Config fields.
const (
	DefaultStore             = storeurl.Default
	DefaultRelayWorkers      = 1
	DefaultRelayInterval     = time.Second
	DefaultMaxAttempts       = 8
	DefaultBackoffBase       = time.Second
	DefaultBackoffMax        = 5 * time.Minute
	DefaultDeliverTimeout    = 10 * time.Second
	DefaultReconcileInterval = 10 * time.Second
	DefaultSettleAfter       = time.Minute
	DefaultReconcileBatch    = 100
	DefaultLedgerGrace       = time.Minute
	DefaultKeyTTL            = 24 * time.Hour
)

// MaxAmountCents is the largest amount a payment may have: 100,000,000
// cents, one million in the currency's major unit.
const MaxAmountCents = 100_000_000

// Currencies are the ISO 4217 codes a payment may use: currencies with two
// minor units, so amount_cents means what it says.
var Currencies = []string{"AUD", "CAD", "CHF", "CZK", "DKK", "EUR", "GBP", "NOK", "NZD", "PLN", "SEK", "USD"}

// CrashPoint names a point in the service where a test may kill the
// process (Config.Crash).
type CrashPoint string

// The crash points, in the order a payment passes them.
const (
	// CrashAfterReserve is in the handler, after the key was reserved and
	// before anything was written.
	CrashAfterReserve CrashPoint = "after_reserve"
	// CrashAfterCommit is after the payment, its outbox row and the key's
	// completion committed, before the 201 is sent.
	CrashAfterCommit CrashPoint = "after_commit"
	// CrashAfterCharge is in the relay, after the provider charged and
	// answered, before the payment is marked succeeded.
	CrashAfterCharge CrashPoint = "after_charge"
	// CrashMidReconcile is in reconciliation, after the provider was asked
	// and before the answer is recorded.
	CrashMidReconcile CrashPoint = "mid_reconcile"
)

// CrashPoints lists every CrashPoint.
var CrashPoints = []CrashPoint{CrashAfterReserve, CrashAfterCommit, CrashAfterCharge, CrashMidReconcile}

// Config configures a Service. ProviderURL and Tokens are required.
type Config struct {
	// Store is the service's database: sqlite:PATH or postgres://…
	// (?schema=NAME). It holds the idempotency keys, the outbox and the
	// payments, migrated at start. Defaults to DefaultStore, sqlite:./idem.db.
	Store string
	// Tokens maps each tenant to its bearer token. Required unless
	// DemoTenant is set: at least one.
	Tokens map[string]string
	// DemoTenant, with no Tokens, is the only tenant; its token is kept in
	// the database: made by NewDemoToken on the first start, read on the
	// next ones (Service.DemoToken). Defaults to "": Tokens are required.
	DemoTenant string
	// ProviderURL is the payment provider's base URL, e.g.
	// http://127.0.0.1:8081. Required.
	ProviderURL string
	// Events, when set, publishes a payment.succeeded event (Event) for
	// every payment that succeeds: written to the outbox in the transaction
	// that marks the payment succeeded and published by the relays, with
	// the event's id as the idempotency key (outbox/outboxnats,
	// outbox/outboxamqp). Defaults to nil: no events.
	Events outbox.Publisher
	// HTTPClient calls the provider. Defaults to a client of its own; each
	// call is bounded by DeliverTimeout.
	HTTPClient *http.Client

	// KeyTTL is how long an idempotency key's record is kept. The payment
	// itself keeps (tenant, key) unique for as long as it exists. Defaults
	// to 24 hours.
	KeyTTL time.Duration
	// StoreTimeout bounds each call to the idempotency store (idem's
	// Config.StoreTimeout); a call that takes longer answers 503. Defaults
	// to idem's default, 2 seconds.
	StoreTimeout time.Duration
	// KeyLease is the in-progress lock of a payment request's key, renewed
	// while the request runs; after a crash the key waits this long before
	// a retry may run again. Defaults to 30 seconds (the middleware's).
	KeyLease time.Duration
	// RelayWorkers is the number of outbox relays of the process; each
	// delivers one payment at a time. Defaults to 1.
	RelayWorkers int
	// RelayInterval is the pause between relay passes that found little to
	// do; a new payment wakes the relays at once. Defaults to 1 second.
	RelayInterval time.Duration
	// MaxAttempts bounds the charge attempts of a payment before its outbox
	// row is dead-lettered. Defaults to 8.
	MaxAttempts int
	// BackoffBase and BackoffMax shape the exponential backoff (with full
	// jitter) between attempts. Default to 1 second and 5 minutes.
	BackoffBase, BackoffMax time.Duration
	// DeliverTimeout bounds one delivery (a lookup and a charge at the
	// provider) and one reconciliation lookup; a charge that runs out of
	// time has an unknown outcome. A relay pass lasts at most three times
	// as long, and a row claimed by a relay that died is claimed again
	// after that and 5 seconds more. Defaults to 10 seconds.
	DeliverTimeout time.Duration
	// ReconcileInterval is the pause between reconciliation passes.
	// Defaults to 10 seconds.
	ReconcileInterval time.Duration
	// SettleAfter is how long after a dead-lettered payment's last attempt
	// the reconciler takes the provider's "no such charge" as final and
	// fails the payment: longer than any request can stay in flight at the
	// provider. Defaults to 1 minute.
	SettleAfter time.Duration
	// ReconcileBatch bounds the payments one reconciliation pass looks at,
	// and the page of the provider's ledger the ledger reconciliation reads
	// (at most 1000). Defaults to 100.
	ReconcileBatch int
	// LedgerGrace is how long the ledger reconciliation (ReconcileLedgerOnce)
	// keeps looking at a charge before its watermark passes it: a charge
	// with a lower seq may still be committing at the provider, and the
	// clocks of the service and the provider may differ. Defaults to 1
	// minute.
	LedgerGrace time.Duration

	// Crash, when set, is called at each CrashPoint the service passes.
	// TESTING HOOK: the idem command sets it from IDEM_PAYMENTS_CRASH_AT to
	// kill its own process with SIGKILL at that point, for crash tests.
	// Defaults to nil.
	Crash func(CrashPoint)
	// BodyTimeout, MinKeyLength, MaxInProgressPerScope and
	// NewKeysPerSecondPerScope are those of the idem middleware protecting
	// POST /v1/payments (idem.Config); the scope is the tenant. Zero means
	// the middleware's default.
	BodyTimeout              time.Duration
	MinKeyLength             int
	MaxInProgressPerScope    int
	NewKeysPerSecondPerScope float64
	// Metrics receives the idem middleware's decisions and store latencies
	// (idemprom). Defaults to none.
	Metrics idem.Metrics
	// Rand draws the relay's backoff jitter. Defaults to the global source.
	Rand *rand.Rand
	// Logger receives the service's logs. Defaults to slog.Default().
	Logger *slog.Logger
	// Keyring encrypts the stored responses of the idempotency keys at rest
	// (idem's Config.Keyring). Defaults to none: stored in the clear.
	Keyring *idemcrypt.Keyring
	// EncryptionRequired refuses to replay a stored response that is not
	// sealed in the current format (idem's Config.EncryptionRequired); it
	// needs a Keyring. Defaults to false.
	EncryptionRequired bool
	// Now is the clock of the store, the outbox, the relay and the
	// reconciler. Defaults to time.Now.
	Now func() time.Time
}

// withDefaults returns a copy of c with every zero field set to its
// default. It is the only place defaults are applied.
func (c *Config) withDefaults() Config {
	var cfg Config
	if c != nil {
		cfg = *c
	}
	if cfg.Store == "" {
		cfg.Store = DefaultStore
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: &http.Transport{
			Proxy:               nil,
			MaxIdleConnsPerHost: 16,
			IdleConnTimeout:     time.Minute,
		}}
	}
	if cfg.KeyTTL <= 0 {
		cfg.KeyTTL = DefaultKeyTTL
	}
	if cfg.RelayWorkers <= 0 {
		cfg.RelayWorkers = DefaultRelayWorkers
	}
	if cfg.RelayInterval <= 0 {
		cfg.RelayInterval = DefaultRelayInterval
	}
	if cfg.MaxAttempts <= 0 {
		cfg.MaxAttempts = DefaultMaxAttempts
	}
	if cfg.BackoffBase <= 0 {
		cfg.BackoffBase = DefaultBackoffBase
	}
	if cfg.BackoffMax <= 0 {
		cfg.BackoffMax = DefaultBackoffMax
	}
	if cfg.DeliverTimeout <= 0 {
		cfg.DeliverTimeout = DefaultDeliverTimeout
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = DefaultReconcileInterval
	}
	if cfg.SettleAfter <= 0 {
		cfg.SettleAfter = DefaultSettleAfter
	}
	if cfg.ReconcileBatch <= 0 {
		cfg.ReconcileBatch = DefaultReconcileBatch
	}
	if cfg.LedgerGrace <= 0 {
		cfg.LedgerGrace = DefaultLedgerGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return cfg
}

// validate checks the required fields.
func (c *Config) validate() error {
	if len(c.Tokens) == 0 && c.DemoTenant == "" {
		return errors.New("payments: Config.Tokens names no tenant")
	}
	if c.DemoTenant != "" {
		if len(c.Tokens) != 0 {
			return errors.New("payments: Config.DemoTenant and Config.Tokens are exclusive")
		}
		if err := ValidateTenant(c.DemoTenant); err != nil {
			return err
		}
	}
	seen := make(map[string]string)
	for tenant, token := range c.Tokens {
		if err := ValidateTenant(tenant); err != nil {
			return err
		}
		if err := ValidateToken(token); err != nil {
			return fmt.Errorf("payments: the token of tenant %q: %w", tenant, err)
		}
		if other, ok := seen[token]; ok {
			return fmt.Errorf("payments: tenants %q and %q have the same token", other, tenant)
		}
		seen[token] = tenant
	}
	u, err := url.Parse(c.ProviderURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return errors.New("payments: Config.ProviderURL must be an absolute http:// or https:// URL")
	}
	return nil
}

// MinTokenLength is the shortest bearer token accepted.
const MinTokenLength = 16

// ValidateTenant reports a tenant name that is empty, longer than 64 bytes
// or not made of letters, digits, '-', '_' and '.'.
func ValidateTenant(tenant string) error {
	if tenant == "" || len(tenant) > 64 {
		return fmt.Errorf("payments: tenant %q: want 1 to 64 characters", tenant)
	}
	for _, c := range []byte(tenant) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("payments: tenant %q: want letters, digits, '-', '_' and '.'", tenant)
		}
	}
	return nil
}

// ValidateToken reports a bearer token shorter than MinTokenLength or with
// characters outside RFC 6750's token68 set. The error never contains the
// token.
func ValidateToken(token string) error {
	if len(token) < MinTokenLength || len(token) > 512 {
		return fmt.Errorf("want %d to 512 characters", MinTokenLength)
	}
	for _, c := range []byte(token) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '.' || c == '_' || c == '~' || c == '+' || c == '/') {
			return errors.New("want letters, digits and -._~+/")
		}
	}
	return nil
}

// clockOf returns the idem.Clock of a service whose tests set Now: the time
// by now, timers (store-call deadlines, lease renewals) on the wall clock.
// Nil, the wall clock, when now is nil.
func clockOf(now func() time.Time) idem.Clock {
	if now == nil {
		return nil
	}
	return nowClock(now)
}

type nowClock func() time.Time

func (f nowClock) Now() time.Time { return f() }

func (nowClock) AfterFunc(d time.Duration, fn func()) (stop func() bool) {
	return time.AfterFunc(d, fn).Stop
}
