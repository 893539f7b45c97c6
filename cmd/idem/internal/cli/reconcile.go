package cli

import (
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/proxy"
	"github.com/idem-dev/idem/idemmaint"
)

// defaultReconcileConcurrency is --reconcile-concurrency's default: a few
// lookups at once, enough to keep up with a slow lookup without flooding
// it.
const defaultReconcileConcurrency = 4

// reconcileOptions are the flags of the reconciler that `idem maintain` and
// `idem proxy --maintain` share: --reconcile-url and its settings.
type reconcileOptions struct {
	url      string
	header   headerLines
	timeout  time.Duration
	interval time.Duration
	unscoped bool
	// concurrency is the number of lookups at once.
	concurrency int
	// grace is --reconcile-grace; nil leaves the command's default.
	grace *time.Duration
	// tmpl is the parsed --reconcile-url, set by check; nil without it.
	tmpl *idemmaint.URLTemplate
}

// register adds the reconciler's flags to fs with their defaults.
func (o *reconcileOptions) register(fs *flagSet) {
	o.timeout = idemmaint.DefaultLookupTimeout
	o.interval = idemmaint.DefaultReconcileInterval
	o.concurrency = defaultReconcileConcurrency
	fs.StringVar(&o.url, "reconcile-url", o.url,
		"lookup `TEMPLATE` that settles unknown records: GET it with {key}, {method}, {path}, {scope} filled in; "+
			"2xx = applied (its answer is replayed), 404/410 = never applied (released), else asked again later")
	fs.Var(&o.header, "reconcile-header", "`'NAME: VALUE'` sent with every lookup, e.g. 'Authorization: Bearer …'; repeatable "+
		"(the variable takes one a line); values are never printed")
	fs.Var(durationValue{p: &o.timeout}, "reconcile-timeout", "`DURATION` a lookup may take")
	fs.Var(durationValue{p: &o.interval}, "reconcile-interval", "`DURATION` between two reconciliation passes")
	fs.Var(countValue{&o.concurrency}, "reconcile-concurrency", "`N` lookups at once; a pass asks about at most N records "+
		"per --reconcile-timeout of its time and leaves the others for the next pass")
	fs.BoolVar(&o.unscoped, "reconcile-unscoped", o.unscoped,
		"the upstream's keys are global: look up a scoped record by a --reconcile-url without {scope} (else such a record is not looked up)")
	fs.Var(optionalDuration{&o.grace}, "reconcile-grace", "`DURATION` after a record's lease ended before the reconciler asks about it: "+
		"the longest time the upstream may still act on a request it was sent; 0 for none "+
		"(default 1m, idem proxy's upstream timeout; for idem proxy its --lease when longer)")
}

// check validates the flags after parsing; maintained reports that a
// maintainer runs (always for `idem maintain`, --maintain for the proxy),
// and scopeHeader is the proxy's --scope-header (empty for `idem
// maintain`, which does not know how the keys were scoped). Its errors
// never repeat the template or a header's value: they may hold
// credentials.
func (o *reconcileOptions) check(maintained bool, scopeHeader string) error {
	if o.header.err != nil {
		return usageErrorf("--reconcile-header (or %s): %v", envName("reconcile-header"), o.header.err)
	}
	if o.concurrency < 1 {
		return usageErrorf("--reconcile-concurrency must be at least 1")
	}
	if o.url == "" {
		if len(o.header.h) > 0 {
			return usageErrorf("--reconcile-header needs --reconcile-url")
		}
		if o.unscoped {
			return usageErrorf("--reconcile-unscoped needs --reconcile-url")
		}
		return nil
	}
	if !maintained {
		return usageErrorf("--reconcile-url runs in the maintainer: add --maintain, or run 'idem maintain --reconcile-url'")
	}
	t, err := idemmaint.ParseURLTemplate(o.url)
	if err != nil {
		return usageErrorf("--reconcile-url (or %s): %v", envName("reconcile-url"), err)
	}
	if scopeHeader != "" && !t.HasScope() && !o.unscoped {
		return usageErrorf("--reconcile-url has no {scope} while --scope-header scopes the keys: a lookup would settle "+
			"one tenant's key with another tenant's answer for the same key; add {scope} to the template, "+
			"or --reconcile-unscoped (%s) if the upstream's keys are global", envName("reconcile-unscoped"))
	}
	if o.unscoped {
		t = t.Unscoped()
	}
	o.tmpl = t
	return nil
}

// apply sets the maintainer's reconciler from the options: answers up to
// maxBody bytes are stored for replay, and records are asked about once
// their lease ended plus --reconcile-grace, or defaultGrace without it.
// Without --reconcile-url it changes nothing.
func (o *reconcileOptions) apply(e *env, cfg *idemmaint.Config, maxBody int64, defaultGrace time.Duration) {
	if o.tmpl == nil {
		return
	}
	cfg.ReconcileInterval = o.interval
	cfg.ReconcileConcurrency = o.concurrency
	cfg.ReconcileTimeout = o.timeout
	// A pass has time for two rounds of lookups at least, however long
	// --reconcile-timeout is.
	cfg.PassTimeout = max(idemmaint.DefaultPassTimeout, 2*o.timeout)
	grace := o.graceOr(defaultGrace)
	cfg.Grace = grace
	if grace == 0 {
		cfg.Grace = -1 // none
	}
	cfg.Reconcile = idemmaint.HTTPReconciler(o.tmpl, &idemmaint.HTTPConfig{
		Header:  o.header.h,
		Timeout: o.timeout,
		MaxBody: maxBody,
	})
	cfg.OnReconcile = func(res idemmaint.ReconcileResult, err error) {
		if err != nil || res.Unresolved == 0 {
			return
		}
		e.logger.Warn("idem maintain: the reconciler could not settle some unknown records yet; it asks again with backoff, or settle them with 'idem keys resolve'",
			slog.Int("count", res.Unresolved))
	}
	names := make([]string, 0, len(o.header.h))
	for name := range o.header.h {
		names = append(names, name)
	}
	slices.Sort(names)
	origin := ""
	if u, err := url.Parse(o.url); err == nil {
		origin = u.Scheme + "://" + u.Host // not the path or query: they may hold a credential
	}
	e.logger.Info("reconciling unknown records",
		"lookup", origin,
		"headers", strings.Join(names, ","),
		"timeout", o.timeout,
		"interval", o.interval,
		"concurrency", o.concurrency,
		"unscoped", o.unscoped,
		"grace", grace,
	)
}

// graceOr returns --reconcile-grace, or def when it was not given.
func (o *reconcileOptions) graceOr(def time.Duration) time.Duration {
	if o.grace == nil {
		return def
	}
	return *o.grace
}

// defaultGrace is --reconcile-grace's default: the longest the upstream of
// an idem proxy with this lease may still act on a request the proxy sent
// (the proxy's upstream timeout), and never less than the lease.
func defaultGrace(lease time.Duration) time.Duration {
	return max(proxy.DefaultTimeout, lease)
}

// optionalDuration is a duration flag, zero allowed, whose default is
// decided after parsing: it stays nil when not given.
type optionalDuration struct{ p **time.Duration }

func (v optionalDuration) String() string {
	if v.p == nil || *v.p == nil {
		return ""
	}
	return (*v.p).String()
}

func (v optionalDuration) Set(s string) error {
	var d time.Duration
	if err := (durationValue{p: &d, zeroOK: true}).Set(s); err != nil {
		return err
	}
	*v.p = &d
	return nil
}

// kind names the reconciler in the start-up log: "url" or "none".
func (o *reconcileOptions) kind() string {
	if o.tmpl != nil {
		return "url"
	}
	return "none"
}

// headerLines is a repeatable 'Name: value' flag. A value may hold several
// header lines, one a line, so that one environment variable can carry
// them. Set never fails: the flag package would print the refused value,
// which is often a credential; check reports the first error instead.
type headerLines struct {
	h   http.Header
	err error
}

func (v *headerLines) String() string {
	if v == nil || len(v.h) == 0 {
		return ""
	}
	return "(set)"
}

// hidden keeps the value out of every parse error (hiddenValue).
func (*headerLines) hidden() {}

func (v *headerLines) Set(s string) error {
	for line := range strings.Lines(s) {
		line = strings.TrimRight(line, "\r\n")
		if strings.TrimSpace(line) == "" {
			continue
		}
		name, value, err := parseHeaderLine(line)
		if err != nil {
			if v.err == nil {
				v.err = err
			}
			continue
		}
		if v.h == nil {
			v.h = make(http.Header)
		}
		v.h.Add(name, value)
	}
	return nil
}

// parseHeaderLine parses 'Name: value'. Its errors never hold the value.
func parseHeaderLine(line string) (name, value string, err error) {
	name, value, ok := strings.Cut(line, ":")
	if !ok {
		return "", "", errors.New("want 'NAME: VALUE' (the value is not shown)")
	}
	if !isToken(name) {
		return "", "", errors.New("want 'NAME: VALUE' with a header name before the colon (the value is not shown)")
	}
	value = strings.Trim(value, " \t")
	if value == "" {
		return "", "", errors.New("header " + http.CanonicalHeaderKey(name) + " has no value")
	}
	for _, c := range []byte(value) {
		if c < ' ' && c != '\t' || c == 0x7f {
			return "", "", errors.New("header " + http.CanonicalHeaderKey(name) + " has a control character in its value (not shown)")
		}
	}
	return http.CanonicalHeaderKey(name), value, nil
}
