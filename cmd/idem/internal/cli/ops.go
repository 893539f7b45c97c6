package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/idem-dev/idem"
	"github.com/idem-dev/idem/cmd/idem/internal/console"
	paysvc "github.com/idem-dev/idem/cmd/idem/internal/payments"
	"github.com/idem-dev/idem/cmd/idem/internal/storeurl"
	"github.com/idem-dev/idem/idemcache"
	"github.com/idem-dev/idem/idemmaint"
	"github.com/idem-dev/idem/idemprom"
	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/redact"
	"github.com/idem-dev/idem/outbox"
)

// opsOptions are the operations flags the serving commands share.
type opsOptions struct {
	listen       string
	consoleToken string
	// secureCookie marks the console's session cookie Secure on every
	// request (console.Config.SecureCookie).
	secureCookie bool
	addr         string // the address bound, once startOps listens
}

// consoleURL is the console's URL once startOps listens with a console
// token, else "".
func (o *opsOptions) consoleURL() string {
	if o.addr == "" || o.consoleToken == "" {
		return ""
	}
	return "http://" + o.addr + "/_idem/"
}

// consoleSignIn says how to sign in to the console, for banners.
const consoleSignIn = "sign in with the --console-token value; scripts send it as Authorization: Bearer"

// register adds --ops-listen, --console-token and --console-secure-cookie
// to fs.
func (o *opsOptions) register(fs *flagSet) {
	fs.StringVar(&o.listen, "ops-listen", o.listen,
		"`ADDR` serving /metrics (Prometheus) and, with --console-token, the operator console under /_idem/")
	fs.StringVar(&o.consoleToken, "console-token", o.consoleToken,
		"`TOKEN` (at least 16 bytes) that enables the operator console under /_idem/; off without it")
	fs.BoolVar(&o.secureCookie, "console-secure-cookie", o.secureCookie,
		"mark the console's session cookie Secure on every request, for a TLS proxy in front that sends neither X-Forwarded-Proto: https nor Forwarded: proto=https (with them, or over TLS, it is Secure anyway)")
}

// opsParts are what the operations endpoints report on; Maintainer and
// Outbox may be nil.
type opsParts struct {
	Store idemstore.Store
	// Masters names the servers of a store spread over several (see
	// mastersOf); nil means those of Store, if any. The proxy sets it when
	// Store is wrapped in a cache.
	Masters    func(context.Context) ([]string, error)
	Maintainer *idemmaint.Maintainer
	Outbox     outbox.Store
	Logger     *slog.Logger
	// TenantLabel fills the tenant label of the decision metrics
	// (idemprom.Config.TenantLabel).
	TenantLabel bool
	// Payments, when set, adds the ledger discrepancies (metric, console).
	Payments *paysvc.Service
}

// ops holds the metrics the middleware reports to and the handler serving
// /metrics and /_idem/.
type ops struct {
	Metrics idem.Metrics
	Handler http.Handler
	// sample, when the console is on, feeds its trends until ctx ends;
	// startOps runs it.
	sample func(ctx context.Context)
}

// newOps builds the Prometheus registry (the middleware's decisions and
// store latencies, the maintainer's gauges, the Go runtime) and, when a
// console token is set, the console.
func newOps(o *opsOptions, p opsParts) (*ops, error) {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := idemprom.New(reg, &idemprom.Config{TenantLabel: p.TenantLabel})
	if p.Maintainer != nil || p.Outbox != nil || p.Store != nil {
		if err := idemprom.RegisterMaintainer(reg, func() idemprom.MaintainerStats { return maintainerStats(p) }); err != nil {
			return nil, err
		}
	}
	if p.Payments != nil {
		if err := reg.Register(ledgerCollector{p.Payments}); err != nil {
			return nil, err
		}
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	var sample func(context.Context)
	if o.consoleToken != "" {
		masters := p.Masters
		if masters == nil {
			masters = mastersOf(p.Store)
		}
		cfg := console.Config{
			Store:        p.Store,
			Masters:      masters,
			Token:        o.consoleToken,
			SecureCookie: o.secureCookie,
			Decisions:    metrics.DecisionTotals,
			Logger:       p.Logger,
			Stats: func(context.Context) []console.Stat {
				return consoleStats(maintainerStats(p))
			},
		}
		if p.Outbox != nil {
			cfg.Outbox = consoleOutbox{p.Outbox}
		}
		cfg.Trends = console.NewTrends()
		if p.Payments != nil {
			cfg.Ledger = consoleLedger{p.Payments}
		}
		h, err := console.New(cfg)
		if err != nil {
			return nil, fmt.Errorf("console: %w", err)
		}
		sample = func(ctx context.Context) {
			cfg.Trends.Run(ctx, console.DefaultSampleEvery, func(ctx context.Context) console.Sample { return console.Collect(ctx, cfg) })
		}
		mux.Handle("/_idem/", h)
		mux.Handle("GET /{$}", http.RedirectHandler("/_idem/", http.StatusFound))
	} else {
		mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "text/plain; charset=utf-8")
			fmt.Fprint(w, "idem operations: GET /metrics (Prometheus).\n"+
				"The operator console under /_idem/ is off: start the command with --console-token TOKEN to turn it on.\n")
		})
	}
	return &ops{Metrics: metrics, Handler: mux, sample: sample}, nil
}

// maintainerStats reads the maintainer's figures and the outbox depth.
func maintainerStats(p opsParts) idemprom.MaintainerStats {
	var s idemprom.MaintainerStats
	if m := p.Maintainer; m != nil {
		st := m.Stats()
		s.UnknownBacklog, s.UnknownBacklogTruncated = st.UnknownBacklog, st.UnknownBacklogTruncated
		s.Unresolved, s.OldestInProgress = st.Unresolved, st.OldestInProgress
		s.Swept, s.Reaped = st.Swept, st.Reaped
		s.ResolvedCompleted, s.ResolvedReleased = st.Completed, st.Released
		s.ReconcileErrors, s.PassErrors = st.ReconcileErrors, st.PassErrors
		s.ReconcileScheduled, s.OldestUnknown = st.ReconcileScheduled, st.OldestUnknown
		s.ReconcileLeft = st.ReconcileLeft
	}
	if p.Store != nil {
		// The backlog as the store counts it now, whichever node asks and
		// whether or not this one reconciles; the maintainer's figure from
		// its last pass when the store does not answer in time.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if b, err := p.Store.KeyBacklog(ctx); err == nil {
			s.UnknownBacklog, s.UnknownBacklogTruncated, s.OldestUnknown = b.Unknown, false, 0
			if !b.OldestUnknownSince.IsZero() {
				s.OldestUnknown = max(time.Since(b.OldestUnknownSince), 0)
			}
		}
	}
	if p.Outbox != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if counts, err := p.Outbox.MessageCounts(ctx); err == nil {
			s.Outbox = true
			s.OutboxDepth = counts[outbox.StatePending]
			s.DeadLetters = counts[outbox.StateDead]
		}
	}
	return s
}

func consoleStats(s idemprom.MaintainerStats) []console.Stat {
	stats := []console.Stat{
		{Name: "Unknown backlog", Value: strconv.Itoa(s.UnknownBacklog), Warn: s.UnknownBacklog > 0},
		{Name: "Oldest unknown", Value: s.OldestUnknown.Round(time.Second).String(), Warn: s.OldestUnknown > 0},
		{Name: "Unresolved after reconciliation", Value: strconv.Itoa(s.Unresolved), Warn: s.Unresolved > 0},
		{Name: "Oldest in-progress lease", Value: s.OldestInProgress.Round(time.Second).String()},
		{Name: "Leases swept", Value: strconv.FormatInt(s.Swept, 10)},
		{Name: "Records reaped", Value: strconv.FormatInt(s.Reaped, 10)},
	}
	if s.Outbox {
		stats = append(stats,
			console.Stat{Name: "Outbox depth", Value: strconv.Itoa(s.OutboxDepth)},
			console.Stat{Name: "Dead letters", Value: strconv.Itoa(s.DeadLetters), Warn: s.DeadLetters > 0})
	}
	return stats
}

// consoleOutbox adapts an outbox.Store to the console's Outbox.
type consoleOutbox struct{ s outbox.Store }

func (c consoleOutbox) MessageList(ctx context.Context, p *console.OutboxListParams) ([]*console.OutboxMessage, error) {
	msgs, err := c.s.MessageList(ctx, &outbox.ListParams{State: outbox.State(p.State), AfterID: p.AfterID, Limit: p.Limit})
	if err != nil {
		return nil, err
	}
	out := make([]*console.OutboxMessage, len(msgs))
	for i, m := range msgs {
		out[i] = &console.OutboxMessage{
			ID: m.ID, Topic: m.Topic, IdempotencyKey: m.IdempotencyKey, State: string(m.State),
			Attempts: m.Attempts, AvailableAt: m.AvailableAt, LastError: m.LastError,
			Payload: m.Payload, CreatedAt: m.CreatedAt, UpdatedAt: m.UpdatedAt,
		}
	}
	return out, nil
}

func (c consoleOutbox) MessageCounts(ctx context.Context) (map[string]int, error) {
	counts, err := c.s.MessageCounts(ctx)
	if err != nil {
		return nil, err
	}
	out := make(map[string]int, len(counts))
	for state, n := range counts {
		out[string(state)] = n
	}
	return out, nil
}

func (c consoleOutbox) MessageRedrive(ctx context.Context, id int64) error {
	err := c.s.MessageRedrive(ctx, id)
	if errors.Is(err, outbox.ErrNotFound) {
		return fmt.Errorf("%w: %w", console.ErrNoDeadMessage, err)
	}
	return err
}

// startOps serves h on o.listen until ctx ends; an empty address serves
// nothing. The returned wait blocks until the server has stopped. When the
// console is on, its URL is logged.
func startOps(ctx context.Context, e *env, o *opsOptions, h *ops) (wait func(), err error) {
	if o.listen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return nil, fmt.Errorf("ops listener: %w", err)
	}
	o.addr = ln.Addr().String()
	srv := &http.Server{Handler: h.Handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		if h.sample != nil {
			h.sample(ctx)
		}
	}()
	go func() {
		defer close(done)
		defer func() { <-sampled }()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			e.logger.Error("ops listener stopped", "error", err)
		}
	}()
	go func() {
		<-ctx.Done()
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(sctx)
	}()
	if url := o.consoleURL(); url != "" {
		e.logger.Info("ops listening", "ops_addr", o.addr, "metrics", "/metrics", "console", url)
	} else {
		e.logger.Info("ops listening", "ops_addr", o.addr, "metrics", "/metrics")
	}
	return func() { <-done }, nil
}

// openCache wraps store in the replay cache named by rawURL: "memory:" for
// an in-process LRU (64 MiB), a Redis URL of any topology (redis://,
// redis+cluster://, redis+sentinel://; ?prefix= names the cache's keys) for
// Redis. Empty means no cache. A Redis that does not answer at start is not
// an error (the cache fails open, the store answers), but a redis:// URL
// naming a cluster node is.
func openCache(ctx context.Context, rawURL string, store idemstore.Store, logger *slog.Logger) (idemstore.Store, func() error, error) {
	switch {
	case rawURL == "":
		return store, func() error { return nil }, nil
	case rawURL == "memory:":
		return idemcache.New(store, idemcache.NewLRU(0, 0), &idemcache.Config{Logger: logger}), func() error { return nil }, nil
	case storeurl.Kind(rawURL) == storeurl.KindRedis:
		r, err := storeurl.ParseRedis(rawURL)
		if err != nil {
			return nil, nil, fmt.Errorf("cache URL %s: %w", storeurl.Redact(rawURL), redact.Error(err, rawURL))
		}
		if r.WaitReplicas > 0 {
			return nil, nil, errors.New("cache URL: wait_replicas applies to the store, not to the cache (a lost cache entry costs a store read)")
		}
		// A cache must fail fast: the store answers when it cannot.
		r.FailFast()
		client, err := r.Connect(ctx)
		switch {
		case errors.Is(err, storeurl.ErrClusterNode):
			return nil, nil, fmt.Errorf("cache URL %s: %w", storeurl.Redact(rawURL), err)
		case err != nil:
			if logger != nil {
				logger.Warn("the replay cache does not answer yet: requests go to the store until it does",
					"cache", storeurl.Redact(rawURL), "error", err)
			}
			client = r.NewClient()
		}
		return idemcache.New(store, idemcache.NewRedis(client, r.Prefix), &idemcache.Config{Logger: logger}), client.Close, nil
	}
	return nil, nil, fmt.Errorf("cache URL %q: want memory:, redis://…, redis+cluster://… or redis+sentinel://…", storeurl.Redact(rawURL))
}
