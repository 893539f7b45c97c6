package idemprom

import (
	"context"
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/idemstore"
)

// Other is the label value that replaces an endpoint or tenant once its label
// has Config.MaxLabelValues distinct values.
const Other = "other"

// DefaultMaxLabelValues is the default of Config.MaxLabelValues.
const DefaultMaxLabelValues = 100

// maxLabelLength bounds one label value in bytes; longer values are cut.
const maxLabelLength = 200

// maxSmallLabelValues bounds the labels whose values the middleware itself
// chooses from a short list (decision, op, outcome): a safety net, never
// reached.
const maxSmallLabelValues = 32

// Default histogram buckets.
var (
	// DefaultLatencyBuckets are the buckets of idem_store_call_seconds: 0.5 ms
	// to about 4 s.
	DefaultLatencyBuckets = prometheus.ExponentialBuckets(0.0005, 2, 14)
	// DefaultSizeBuckets are the buckets of idem_response_stored_bytes: 64 B
	// to 4 MiB.
	DefaultSizeBuckets = prometheus.ExponentialBuckets(64, 4, 9)
)

// Config configures Metrics. A nil *Config means all defaults.
type Config struct {
	// TenantLabel fills the tenant label of idem_decisions_total with the
	// request's scope. Enable it only where the number of tenants is
	// bounded; past MaxLabelValues tenants the rest count as "other".
	// Defaults to false: the label is always empty.
	TenantLabel bool
	// MaxLabelValues bounds the distinct values of the endpoint label and of
	// the tenant label (each); further values are reported as "other".
	// Defaults to 100.
	MaxLabelValues int
	// LatencyBuckets are the buckets of idem_store_call_seconds, in seconds.
	// Defaults to DefaultLatencyBuckets.
	LatencyBuckets []float64
	// SizeBuckets are the buckets of idem_response_stored_bytes. Defaults to
	// DefaultSizeBuckets.
	SizeBuckets []float64
}

// withDefaults returns a copy of cfg (which may be nil) with every zero field
// set to its default. It is the only place defaults are applied.
func (cfg *Config) withDefaults() Config {
	var c Config
	if cfg != nil {
		c = *cfg
	}
	if c.MaxLabelValues <= 0 {
		c.MaxLabelValues = DefaultMaxLabelValues
	}
	if len(c.LatencyBuckets) == 0 {
		c.LatencyBuckets = DefaultLatencyBuckets
	}
	if len(c.SizeBuckets) == 0 {
		c.SizeBuckets = DefaultSizeBuckets
	}
	return c
}

// Metrics implements idem.Metrics with Prometheus collectors. It is safe for
// concurrent use.
type Metrics struct {
	cfg Config

	decisions  *prometheus.CounterVec
	storeCalls *prometheus.HistogramVec
	stored     *prometheus.HistogramVec
	terminated *prometheus.CounterVec

	endpoints, tenants, decisionValues, ops, outcomes *labelLimiter

	// totals counts decisions over all endpoints and tenants, for
	// DecisionTotals: decision label value -> *atomic.Uint64.
	totals sync.Map

	// The series already resolved from the values a method was called
	// with, so that a request finds its counters without the label
	// limiters' locks and the vectors' hashing: decisionKey ->
	// *decisionSeries, storeCallKey -> prometheus.Observer, endpoint ->
	// prometheus.Observer. A limiter's answer for a value never changes
	// once given (an admitted value stays admitted, and once it is full a
	// new value is Other for good), so a cached series is the one the
	// slow path would find. Each holds at most maxCachedSeries entries;
	// beyond, calls take the slow path.
	decisionSeries, storeCallSeries, storedSeries seriesCache
	// decisionSlots front decisionSeries: a key's hash picks one slot,
	// filled once by the first key resolved into it (see Decision), so a
	// request finds its series with a string hash and a comparison instead
	// of sync.Map's hashing and comparing of the key through an interface.
	// Two keys on one slot: the later one takes the sync.Map as before.
	decisionSlots [decisionSlotCount]atomic.Pointer[decisionSlot]
	seed          maphash.Seed
	// okCalls are the series of the successful store calls of the
	// middleware's operations (okOps), resolved on first use: every
	// request makes one or two, found here without hashing a key.
	okCalls [len(okOps)]atomic.Pointer[observer]
}

// okOps are the store call operations the middleware reports.
var okOps = [...]string{"reserve", "complete", "release", "mark_unknown", "delete", "renew", "commit"}

// okOp returns the index of op in okOps, or -1.
func okOp(op string) int {
	switch op {
	case "reserve":
		return 0
	case "complete":
		return 1
	case "release":
		return 2
	case "mark_unknown":
		return 3
	case "delete":
		return 4
	case "renew":
		return 5
	case "commit":
		return 6
	}
	return -1
}

type observer struct{ prometheus.Observer }

// maxCachedSeries bounds each cache of resolved series.
const maxCachedSeries = 1024

// seriesCache is a bounded sync.Map.
type seriesCache struct {
	m sync.Map
	n atomic.Int64
}

// store remembers v for k unless the cache is full, and returns the value
// k has.
func (c *seriesCache) store(k, v any) any {
	if c.n.Load() >= maxCachedSeries {
		return v
	}
	got, loaded := c.m.LoadOrStore(k, v)
	if !loaded {
		c.n.Add(1)
	}
	return got
}

type decisionKey struct {
	endpoint, scope string
	d               idem.Decision
}

// decisionSlotCount is the number of Metrics.decisionSlots.
const decisionSlotCount = 256

type decisionSlot struct {
	k decisionKey
	s *decisionSeries
}

// slot returns the decisionSlots entry of k.
func (m *Metrics) slot(k decisionKey) *atomic.Pointer[decisionSlot] {
	h := maphash.String(m.seed, k.endpoint) ^ maphash.String(m.seed, string(k.d))*31
	if k.scope != "" {
		h ^= maphash.String(m.seed, k.scope) * 961
	}
	return &m.decisionSlots[h%decisionSlotCount]
}

type decisionSeries struct {
	count prometheus.Counter
	total *atomic.Uint64 // in totals
}

type storeCallKey struct{ op, result string }

var _ idem.Metrics = (*Metrics)(nil)

// New returns Metrics registered with reg (prometheus.DefaultRegisterer when
// reg is nil). cfg may be nil. When reg already holds collectors of the same
// name and labels (a second New on one registry), their existing series are
// shared. Like prometheus.MustRegister, New panics when registration fails
// for another reason (a name registered with other labels).
func New(reg prometheus.Registerer, cfg *Config) *Metrics {
	c := cfg.withDefaults()
	if reg == nil {
		reg = prometheus.DefaultRegisterer
	}
	m := &Metrics{
		seed:           maphash.MakeSeed(),
		cfg:            c,
		endpoints:      newLabelLimiter(c.MaxLabelValues),
		tenants:        newLabelLimiter(c.MaxLabelValues),
		decisionValues: newLabelLimiter(maxSmallLabelValues),
		ops:            newLabelLimiter(maxSmallLabelValues),
		outcomes:       newLabelLimiter(maxSmallLabelValues),
	}
	m.decisions = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_decisions_total",
		Help: "Protected requests by the idempotency middleware's decision (created, replayed, in_progress, key_reused, released_retried, unknown, store_error, not_replayable, invalid, too_many_keys, untrusted).",
	}, []string{"endpoint", "tenant", "decision"}))
	m.storeCalls = register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idem_store_call_seconds",
		Help:    "Latency of the idempotency store calls by operation (reserve, complete, release, mark_unknown, delete, renew, commit) and result (ok, lease_lost, not_found, invalid_state, timeout, canceled, error).",
		Buckets: c.LatencyBuckets,
	}, []string{"op", "result"}))
	m.stored = register(reg, prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "idem_response_stored_bytes",
		Help:    "Size of the response bodies stored for replay.",
		Buckets: c.SizeBuckets,
	}, []string{"endpoint"}))
	m.terminated = register(reg, prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "idem_messages_terminated_total",
		Help: "Messages a consumer (idemnats) terminated, by outcome (key_reused, unknown, untrusted, missing_id, max_deliveries).",
	}, []string{"endpoint", "outcome"}))
	return m
}

// register registers c with reg and returns it, or the collector already
// registered under the same description.
func register[C prometheus.Collector](reg prometheus.Registerer, c C) C {
	if err := reg.Register(c); err != nil {
		var already prometheus.AlreadyRegisteredError
		if errors.As(err, &already) {
			if existing, ok := already.ExistingCollector.(C); ok {
				return existing
			}
		}
		panic("idemprom: " + err.Error())
	}
	return c
}

// Decision counts one request's decision on an endpoint for a scope.
func (m *Metrics) Decision(endpoint, scope string, d idem.Decision) {
	if !m.cfg.TenantLabel {
		scope = "" // not a label: one series for every scope
	}
	k := decisionKey{endpoint, scope, d}
	slot := m.slot(k)
	if e := slot.Load(); e != nil && e.k == k {
		e.s.count.Inc()
		e.s.total.Add(1)
		return
	}
	s, ok := m.decisionSeries.m.Load(k)
	if !ok {
		s = m.decisionSeries.store(k, m.newDecisionSeries(k))
	}
	ds := s.(*decisionSeries)
	if slot.Load() == nil {
		// The series the sync.Map gave, cached or not, is the one every
		// later call with k resolves to (see decisionSeries).
		slot.CompareAndSwap(nil, &decisionSlot{k: k, s: ds})
	}
	ds.count.Inc()
	ds.total.Add(1)
}

func (m *Metrics) newDecisionSeries(k decisionKey) *decisionSeries {
	tenant := ""
	if m.cfg.TenantLabel {
		tenant = m.tenants.value(k.scope)
	}
	decision := m.decisionValues.value(string(k.d))
	n, ok := m.totals.Load(decision)
	if !ok {
		n, _ = m.totals.LoadOrStore(decision, new(atomic.Uint64))
	}
	return &decisionSeries{
		count: m.decisions.WithLabelValues(m.endpoints.value(k.endpoint), tenant, decision),
		total: n.(*atomic.Uint64),
	}
}

// StoreCall observes the latency of one store call, labelled with the
// operation and the kind of its result.
func (m *Metrics) StoreCall(op string, d time.Duration, err error) {
	if err == nil {
		if i := okOp(op); i >= 0 {
			o := m.okCalls[i].Load()
			if o == nil {
				o = &observer{m.storeCalls.WithLabelValues(m.ops.value(op), "ok")}
				m.okCalls[i].Store(o)
			}
			o.Observe(d.Seconds())
			return
		}
	}
	k := storeCallKey{op, Result(err)}
	o, ok := m.storeCallSeries.m.Load(k)
	if !ok {
		o = m.storeCallSeries.store(k, m.storeCalls.WithLabelValues(m.ops.value(op), k.result))
	}
	o.(prometheus.Observer).Observe(d.Seconds())
}

// ResponseStored observes the size of a stored response body.
func (m *Metrics) ResponseStored(endpoint string, bytes int) {
	o, ok := m.storedSeries.m.Load(endpoint)
	if !ok {
		o = m.storedSeries.store(endpoint, m.stored.WithLabelValues(m.endpoints.value(endpoint)))
	}
	o.(prometheus.Observer).Observe(float64(bytes))
}

// MessageTerminated counts a message a consumer terminated, by endpoint
// and outcome: idemnats reports its terminations here (idemnats.TermMetrics).
func (m *Metrics) MessageTerminated(endpoint, outcome string) {
	m.terminated.WithLabelValues(m.endpoints.value(endpoint), m.outcomes.value(outcome)).Inc()
}

// DecisionTotals returns the number of decisions of each kind counted by m
// since New, over all endpoints and tenants. The operator console shows them
// and derives rates from them.
func (m *Metrics) DecisionTotals() map[string]float64 {
	out := make(map[string]float64)
	m.totals.Range(func(k, v any) bool {
		out[k.(string)] = float64(v.(*atomic.Uint64).Load())
		return true
	})
	return out
}

// Result names the kind of a store call's error for the result label: "ok",
// "lease_lost", "not_found", "invalid_state", "timeout", "canceled" or
// "error" (the store is unavailable).
func Result(err error) string {
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, idemstore.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, idemstore.ErrNotFound):
		return "not_found"
	case errors.Is(err, idemstore.ErrInvalidState):
		return "invalid_state"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "error"
}

// labelLimiter bounds the distinct values of one label: the first max values
// it sees pass, later new ones become Other.
type labelLimiter struct {
	max  int
	mu   sync.RWMutex
	seen map[string]struct{}
}

func newLabelLimiter(max int) *labelLimiter {
	return &labelLimiter{max: max, seen: make(map[string]struct{})}
}

// value returns v (made a valid, bounded label value) if it is admitted, and
// Other otherwise.
func (l *labelLimiter) value(v string) string {
	v = sanitize(v)
	l.mu.RLock()
	_, ok := l.seen[v]
	full := len(l.seen) >= l.max
	l.mu.RUnlock()
	switch {
	case ok:
		return v
	case full:
		return Other
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[v]; ok {
		return v
	}
	if len(l.seen) >= l.max {
		return Other
	}
	l.seen[v] = struct{}{}
	return v
}

// sanitize makes v a valid UTF-8 label value of at most maxLabelLength bytes
// (client_golang panics on invalid UTF-8).
func sanitize(v string) string {
	if !utf8.ValidString(v) {
		v = strings.ToValidUTF8(v, "\uFFFD")
	}
	if len(v) > maxLabelLength {
		cut := maxLabelLength
		for cut > 0 && !utf8.RuneStart(v[cut]) {
			cut--
		}
		v = v[:cut]
	}
	return v
}
