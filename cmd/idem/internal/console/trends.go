package console

import (
	"context"
	"encoding/json"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"sync"
	"time"

	"github.com/idem-dev/idem/idemstore"
)

// Trend sizes: one bucket per minute for the last hour; the observations of
// the last rateSpan for the sliding-window rates.
const (
	trendMinutes = 60
	rateSpan     = 5 * time.Minute
	// DefaultSampleEvery is how often Trends.Run observes.
	DefaultSampleEvery = 10 * time.Second
)

// Sample is one observation of the figures the console charts.
type Sample struct {
	// Decisions are the middleware's decision totals since the process
	// started (Config.Decisions); nil when none are connected.
	Decisions map[string]float64
	// Outbox reports whether OutboxDepth and DeadLetters were read.
	Outbox                   bool
	OutboxDepth, DeadLetters int
	// UnknownBacklog is the number of unknown records (at most
	// Config.CountLimit), OldestUnknown the age of the oldest of them since
	// its last update; Unknown reports whether they were read.
	Unknown        bool
	UnknownBacklog int
	OldestUnknown  time.Duration
}

// observation is a Sample taken at a time.
type observation struct {
	at time.Time
	s  Sample
}

// bucket is one minute of the ring: the totals at its first and last
// observation, and its last observation's gauges.
type bucket struct {
	minute      time.Time
	first, last map[string]float64
	gauges      Sample
}

// Trends is the console's in-process memory of the last hour: a ring of
// per-minute buckets and the observations of the last five minutes. Its
// zero value is not usable; make one with NewTrends. It is safe for
// concurrent use.
type Trends struct {
	mu      sync.Mutex
	buckets []bucket      // oldest first, at most trendMinutes
	recent  []observation // oldest first, within rateSpan of the newest (plus one)
	// observed reports that Observe was called: the first bucket of all
	// counts its decisions from zero (the totals are the process's).
	observed bool
}

// NewTrends returns an empty Trends.
func NewTrends() *Trends { return &Trends{} }

// Observe records s, taken at now.
func (t *Trends) Observe(now time.Time, s Sample) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if n := len(t.recent); n > 0 && now.Before(t.recent[n-1].at) {
		// The clock stepped back: start again rather than show nonsense.
		t.buckets, t.recent = nil, nil
	}
	t.recent = append(t.recent, observation{at: now, s: s})
	for len(t.recent) > 2 && now.Sub(t.recent[1].at) >= rateSpan {
		t.recent = t.recent[1:]
	}
	minute := now.UTC().Truncate(time.Minute)
	if n := len(t.buckets); n > 0 && t.buckets[n-1].minute.Equal(minute) {
		b := &t.buckets[n-1]
		b.last, b.gauges = s.Decisions, s
		return
	}
	first := s.Decisions
	if !t.observed {
		// The decision totals count from the process's start, which the
		// first sample follows closely: what they hold already happened in
		// this first minute (a start-up demo, a burst before the sampler).
		first = nil
	}
	t.observed = true
	t.buckets = append(t.buckets, bucket{minute: minute, first: first, last: s.Decisions, gauges: s})
	for len(t.buckets) > 0 && minute.Sub(t.buckets[0].minute) >= trendMinutes*time.Minute {
		t.buckets = t.buckets[1:]
	}
}

// Run observes collect's samples every interval (DefaultSampleEvery when
// zero), the first at once, until ctx ends.
func (t *Trends) Run(ctx context.Context, every time.Duration, collect func(context.Context) Sample) {
	if every <= 0 {
		every = DefaultSampleEvery
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		sctx, cancel := context.WithTimeout(ctx, every)
		s := collect(sctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		t.Observe(time.Now(), s)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Minute is one minute of the trends, as the charts and the JSON show it.
// A minute without an observation is absent, not zero.
type Minute struct {
	At time.Time `json:"at"`
	// Decisions are the decisions made during the minute, by decision.
	Decisions map[string]float64 `json:"decisions"`
	// The gauges at the minute's last observation; nil when not read.
	OutboxDepth          *int     `json:"outbox_depth,omitempty"`
	DeadLetters          *int     `json:"dead_letters,omitempty"`
	UnknownBacklog       *int     `json:"unknown_backlog,omitempty"`
	OldestUnknownSeconds *float64 `json:"oldest_unknown_seconds,omitempty"`
}

// minutes returns the buckets as Minutes, oldest first. live, when not nil,
// are the decision totals read now, after the last sample: the decisions
// made since then count in now's minute, so the minutes add up to the
// totals a page shows beside them.
func (t *Trends) minutes(now time.Time, live map[string]float64) []Minute {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]Minute, 0, len(t.buckets)+1)
	var base map[string]float64
	for i, b := range t.buckets {
		m := Minute{At: b.minute}
		base = b.first
		if i > 0 && b.minute.Sub(t.buckets[i-1].minute) == time.Minute {
			// The previous minute's last totals: what happened between the
			// two observations is counted in this minute.
			base = t.buckets[i-1].last
		}
		m.Decisions = decisionsSince(base, b.last)
		g := b.gauges
		if g.Outbox {
			depth, dead := g.OutboxDepth, g.DeadLetters
			m.OutboxDepth, m.DeadLetters = &depth, &dead
		}
		if g.Unknown {
			n, age := g.UnknownBacklog, math.Round(g.OldestUnknown.Seconds())
			m.UnknownBacklog, m.OldestUnknownSeconds = &n, &age
		}
		out = append(out, m)
	}
	if live == nil {
		return out
	}
	minute := now.UTC().Truncate(time.Minute)
	n := len(t.buckets)
	switch {
	case n == 0: // no sample yet: the totals count from zero
		out = append(out, Minute{At: minute, Decisions: decisionsSince(nil, live)})
	case minute.Equal(t.buckets[n-1].minute): // sampled: it counts up to now
		out[n-1].Decisions = decisionsSince(base, live)
	case minute.After(t.buckets[n-1].minute):
		out = append(out, Minute{At: minute, Decisions: decisionsSince(t.buckets[n-1].last, live)})
	}
	return out
}

// decisionsSince returns the decisions made between the totals base and
// last, by decision (a total that went down counts 0).
func decisionsSince(base, last map[string]float64) map[string]float64 {
	d := make(map[string]float64, len(last))
	for name, v := range last {
		d[name] = max(v-base[name], 0)
	}
	return d
}

// rates returns the per-minute rate of each decision over the sliding
// window that ends with totals (read now) and starts at the oldest
// observation within rateSpan, and the window's span; no rates when the
// window is shorter than a second.
func (t *Trends) rates(now time.Time, totals map[string]float64) (map[string]float64, time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	var base *observation
	for i := range t.recent {
		o := &t.recent[i]
		if now.Sub(o.at) <= rateSpan && !o.at.After(now) {
			base = o
			break
		}
	}
	if base == nil {
		return nil, 0
	}
	span := now.Sub(base.at)
	if span < time.Second {
		return nil, 0
	}
	rates := make(map[string]float64, len(totals))
	for name, v := range totals {
		if d := v - base.s.Decisions[name]; d >= 0 {
			rates[name] = d / span.Minutes()
		}
	}
	return rates, span
}

// Collect reads one Sample with cfg's sources: the decision totals, the
// outbox counts, and the unknown records (at most cfg.CountLimit, the
// oldest's age by its last update). A source that fails is left out of the
// sample, and logged.
func Collect(ctx context.Context, cfg Config) Sample {
	c := cfg.withDefaults()
	var s Sample
	if c.Decisions != nil {
		s.Decisions = c.Decisions()
	}
	if c.Outbox != nil {
		if counts, err := c.Outbox.MessageCounts(ctx); err != nil {
			c.Logger.Warn("idem console: sampling the outbox failed", slog.Any("error", err))
		} else {
			s.Outbox, s.OutboxDepth, s.DeadLetters = true, counts["pending"], counts["dead"]
		}
	}
	if c.Store != nil {
		n, oldest, err := scanUnknown(ctx, c.Store, c.CountLimit)
		if err != nil {
			c.Logger.Warn("idem console: sampling the unknown records failed", slog.Any("error", err))
		} else {
			s.Unknown, s.UnknownBacklog = true, n
			if !oldest.IsZero() {
				s.OldestUnknown = max(c.Now().Sub(oldest), 0)
			}
		}
	}
	return s
}

// scanUnknown counts the unknown records, at most limit, and returns the
// earliest update time among them.
func scanUnknown(ctx context.Context, store idemstore.Store, limit int) (int, time.Time, error) {
	var after *idemstore.Identity
	var oldest time.Time
	n := 0
	for n < limit {
		page := min(1000, limit-n)
		recs, err := store.KeyList(ctx, &idemstore.ListParams{State: idemstore.StateUnknown, After: after, Limit: page})
		if err != nil {
			return 0, time.Time{}, err
		}
		for _, r := range recs {
			if oldest.IsZero() || r.UpdatedAt.Before(oldest) {
				oldest = r.UpdatedAt
			}
		}
		n += len(recs)
		if len(recs) < page {
			break
		}
		after = &recs[len(recs)-1].Identity
	}
	return n, oldest, nil
}

// decisionKinds are the decision chart's series: a name and the decisions
// it adds up.
var decisionKinds = []struct {
	name, color string
	decisions   []string
}{
	{"created", "#2856c7", []string{"created", "released_retried"}},
	{"replayed", "#067647", []string{"replayed"}},
	{"in progress (409)", "#7a5af8", []string{"in_progress"}},
	{"key reused (422)", "#b54708", []string{"key_reused"}},
	{"store errors (503)", "#b42318", []string{"store_error"}},
}

// chartData is what the overview shows of the trends.
type chartData struct {
	Decisions, Outbox, Unknown template.HTML
	Minutes                    int    // observed minutes
	Span                       int    // the minutes the charts span
	SpanText                   string // "last hour", or "last N minutes (since this process started)"
}

// charts draws the last hour of t, ending with now's minute; while the
// trends are younger than an hour (the process started less than an hour
// ago), they span the trends' life instead, from their first minute.
func (t *Trends) charts(now time.Time, live map[string]float64, withDecisions, withOutbox bool) chartData {
	ms := t.minutes(now, live)
	end := now.UTC().Truncate(time.Minute)
	window := trendMinutes
	spanText := "last hour"
	if len(ms) > 0 {
		if life := int(end.Sub(ms[0].At)/time.Minute) + 1; life < trendMinutes {
			window = max(life, 2) // a line needs two minutes
			spanText = fmt.Sprintf("last %d minutes (since this process started)", window)
		}
	}
	slot := func(at time.Time) int { return window - 1 - int(end.Sub(at)/time.Minute) }
	blank := func() []float64 {
		v := make([]float64, window)
		for i := range v {
			v[i] = math.NaN()
		}
		return v
	}
	kinds := make([][]float64, len(decisionKinds))
	for i := range kinds {
		kinds[i] = blank()
	}
	depth, dead, backlog, oldest := blank(), blank(), blank(), blank()
	for _, m := range ms {
		i := slot(m.At)
		if i < 0 || i >= window {
			continue
		}
		for k, kind := range decisionKinds {
			sum := 0.0
			for _, d := range kind.decisions {
				sum += m.Decisions[d]
			}
			kinds[k][i] = sum
		}
		if m.OutboxDepth != nil {
			depth[i], dead[i] = float64(*m.OutboxDepth), float64(*m.DeadLetters)
		}
		if m.UnknownBacklog != nil {
			backlog[i], oldest[i] = float64(*m.UnknownBacklog), *m.OldestUnknownSeconds/60
		}
	}
	d := chartData{Minutes: len(ms), Span: window, SpanText: spanText}
	if withDecisions {
		ss := make([]series, len(decisionKinds))
		for k, kind := range decisionKinds {
			// The legend sums the minutes: the decisions over the span,
			// which the table's totals are while the process is young.
			ss[k] = series{Name: kind.name, Color: kind.color, Values: kinds[k], Sum: true}
		}
		d.Decisions = lineChart("chart-decisions", "Decisions per minute by kind, "+spanText, end, ss)
	}
	if withOutbox {
		d.Outbox = lineChart("chart-outbox", "Outbox depth and dead letters, "+spanText, end, []series{
			{Name: "pending", Color: "#2856c7", Values: depth},
			{Name: "dead letters", Color: "#b42318", Values: dead},
		})
	}
	d.Unknown = lineChart("chart-unknown", "Unknown backlog and the oldest unknown's age in minutes, "+spanText, end, []series{
		{Name: "unknown records", Color: "#b54708", Values: backlog},
		{Name: "oldest, minutes", Color: "#667085", Values: oldest},
	})
	return d
}

// trendsJSON is the data of the charts for scripts: the last hour by
// minute, and the sliding-window rates.
type trendsJSON struct {
	Now     time.Time `json:"now"`
	Minutes []Minute  `json:"minutes"`
	// RateWindowSeconds is the span of the rates' window (up to 300 s; 0
	// when there are no rates yet), RatesPerMinute the decisions per minute
	// over it.
	RateWindowSeconds float64            `json:"rate_window_seconds"`
	RatesPerMinute    map[string]float64 `json:"rates_per_minute"`
}

// trendsJSON serves the trends as JSON; 404 when the console has none.
func (c *console) trendsJSON(w http.ResponseWriter, r *http.Request) {
	if c.cfg.Trends == nil {
		c.renderError(w, r, http.StatusNotFound, "Not found", "This console keeps no trends.")
		return
	}
	now := c.cfg.Now()
	var totals map[string]float64
	if c.cfg.Decisions != nil {
		totals = c.cfg.Decisions()
	}
	out := trendsJSON{Now: now.UTC(), Minutes: c.cfg.Trends.minutes(now, totals), RatesPerMinute: map[string]float64{}}
	if c.cfg.Decisions != nil {
		rates, span := c.cfg.Trends.rates(now, totals)
		out.RateWindowSeconds = math.Round(span.Seconds())
		for name, v := range rates {
			out.RatesPerMinute[name] = math.Round(v*100) / 100
		}
	}
	body, err := json.MarshalIndent(out, "", "  ")
	if err != nil {
		http.Error(w, "internal error", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(append(body, '\n'))
}
