package cli

import (
	"errors"
	"math"
	"strconv"
	"time"

	"github.com/idem-dev/idem"
)

// safeguardOptions are the middleware's protections the serving commands
// (proxy, payments) expose as flags, so that they are not Go-only.
type safeguardOptions struct {
	bodyTimeout           time.Duration // idem.Config.BodyTimeout, and the server's bound on every body
	minKeyLength          int           // idem.Config.MinKeyLength; 0 is the middleware's 1
	maxInProgressPerScope int           // idem.Config.MaxInProgressPerScope; 0 is no limit
	newKeysPerSecond      float64       // idem.Config.NewKeysPerSecondPerScope; 0 is no limit
	tenantLabel           bool          // idemprom.Config.TenantLabel
}

func defaultSafeguards() safeguardOptions {
	return safeguardOptions{bodyTimeout: idem.DefaultBodyTimeout}
}

// register adds the flags to fs.
func (o *safeguardOptions) register(fs *flagSet) {
	fs.Var(durationValue{p: &o.bodyTimeout}, "body-timeout",
		"`DURATION` a client may take to send a request body; a protected request that runs out gets 408 body-timeout and nothing is stored, others are cut off")
	fs.Var(countValue{&o.minKeyLength}, "min-key-length",
		"`N` characters an Idempotency-Key must have at least (400 key-invalid otherwise); 0 keeps the minimum of 1")
	fs.Var(countValue{&o.maxInProgressPerScope}, "max-in-progress-per-scope",
		"`N` requests of one scope (tenant) in progress at once in this process before a new key gets 429 too-many-keys; 0 is no limit")
	fs.Var(keyRateValue{&o.newKeysPerSecond}, "new-keys-per-second-per-scope",
		"`RATE` of new keys per second per scope (tenant) in this process, burst of the same size; over it 429 too-many-keys, nothing stored; 0 is no limit")
	fs.BoolVar(&o.tenantLabel, "metrics-tenant-label", o.tenantLabel,
		"fill the tenant label of idem_decisions_total with the scope (past 100 tenants the rest count as \"other\")")
}

// apply sets the options on cfg.
func (o *safeguardOptions) apply(cfg *idem.Config) {
	cfg.BodyTimeout = o.bodyTimeout
	cfg.MinKeyLength = o.minKeyLength
	cfg.MaxInProgressPerScope = o.maxInProgressPerScope
	cfg.NewKeysPerSecondPerScope = o.newKeysPerSecond
}

// keyRateValue is a finite rate of at least 0.
type keyRateValue struct{ p *float64 }

func (v keyRateValue) String() string {
	if v.p == nil {
		return ""
	}
	return strconv.FormatFloat(*v.p, 'g', -1, 64)
}

func (v keyRateValue) Set(s string) error {
	f, err := strconv.ParseFloat(s, 64)
	if err != nil || f < 0 || math.IsInf(f, 0) || math.IsNaN(f) {
		return errors.New("want a number, 0 or more, such as 10 or 0.5")
	}
	*v.p = f
	return nil
}
