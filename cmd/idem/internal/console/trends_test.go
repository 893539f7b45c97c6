package console_test

import (
	"encoding/json"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
)

func TestOverviewChartsAndTrendsJSON(t *testing.T) {
	t.Parallel()
	trends := console.NewTrends()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // setup's clock
	totals := feedTrends(trends, now)
	b := setup(t, func(c *console.Config) {
		c.Trends = trends
		c.Decisions = func() map[string]float64 { return totals }
	})
	w := b.get(t, "/_idem/")
	if w.Code != 200 {
		t.Fatalf("overview: %d", w.Code)
	}
	page := w.Body.String()
	for _, id := range []string{"chart-decisions", "chart-outbox", "chart-unknown"} {
		m := regexp.MustCompile(`<svg id="` + id + `"[^>]* data-points="(\d+)"`).FindStringSubmatch(page)
		if m == nil {
			t.Fatalf("no %s on the overview", id)
		}
		if m[1] == "0" {
			t.Errorf("%s has no data points", id)
		}
	}
	if n := strings.Count(page, `<polyline class="line"`); n < 9 {
		t.Errorf("%d lines drawn, want at least 9 (5 decision kinds, 2 outbox, 2 unknown)", n)
	}
	// The CSP allows no script and no style attribute.
	if strings.Contains(page, "<script") || regexp.MustCompile(`\sstyle=`).MatchString(page) {
		t.Errorf("the overview has a script or a style attribute")
	}
	// The sliding window: the oldest observation within five minutes.
	if !strings.Contains(page, "rates over the last 5m") {
		t.Errorf("the rate note does not show the window's span:\n%s", page)
	}

	w = b.get(t, "/_idem/trends.json")
	if w.Code != 200 || w.Header().Get("Content-Type") != "application/json" {
		t.Fatalf("trends.json: %d %s", w.Code, w.Header().Get("Content-Type"))
	}
	var got struct {
		Minutes []struct {
			At             time.Time          `json:"at"`
			Decisions      map[string]float64 `json:"decisions"`
			OutboxDepth    *int               `json:"outbox_depth"`
			DeadLetters    *int               `json:"dead_letters"`
			UnknownBacklog *int               `json:"unknown_backlog"`
			OldestUnknown  *float64           `json:"oldest_unknown_seconds"`
		} `json:"minutes"`
		RateWindow float64            `json:"rate_window_seconds"`
		Rates      map[string]float64 `json:"rates_per_minute"`
	}
	if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if len(got.Minutes) != 60 {
		t.Fatalf("%d minutes, want 60", len(got.Minutes))
	}
	last := got.Minutes[59]
	// feedTrends' last minute: 30+(59%7)*3 created, 4+59%3 + 15*6 replayed.
	if last.Decisions["created"] != 39 || last.Decisions["replayed"] != 96 {
		t.Errorf("last minute's decisions %v, want 39 created and 96 replayed", last.Decisions)
	}
	if *last.UnknownBacklog != 1 || *last.OldestUnknown != 600 || *last.DeadLetters != 1 {
		t.Errorf("last minute's gauges: unknown %d, oldest %vs, dead %d", *last.UnknownBacklog, *last.OldestUnknown, *last.DeadLetters)
	}
	if got.Minutes[21].Decisions["store_error"] != 25 || got.Minutes[10].Decisions["store_error"] != 0 {
		t.Errorf("store errors by minute: %v, %v", got.Minutes[21].Decisions, got.Minutes[10].Decisions)
	}
	// The window is 5 minutes: the replays of minutes 55..59 (the base is
	// the observation of minute 54), per minute.
	want := 0.0
	for i := 55; i < 60; i++ {
		want += 4 + float64(i%3) + float64(i-44)*6
	}
	if got.RateWindow != 300 || got.Rates["replayed"] != want/5 {
		t.Errorf("rates over %vs: %v, want replayed %v/min over 300s", got.RateWindow, got.Rates, want/5)
	}
}

// Right after a burst the rate reads the burst over the window, not 0.
func TestTrendsRateRightAfterABurst(t *testing.T) {
	t.Parallel()
	trends := console.NewTrends()
	var totals map[string]float64
	b := setup(t, func(c *console.Config) {
		c.Trends = trends
		c.Decisions = func() map[string]float64 { return totals }
	})
	now := b.clock.Now()
	trends.Observe(now.Add(-30*time.Second), console.Sample{Decisions: map[string]float64{"created": 0}})
	totals = map[string]float64{"created": 120}
	w := b.get(t, "/_idem/")
	if !regexp.MustCompile(`<td>created</td><td class="num">120</td><td class="num">240.0</td>`).MatchString(w.Body.String()) ||
		!strings.Contains(w.Body.String(), "rates over the last 30s") {
		t.Errorf("want 240.0/min over the last 30s:\n%s", w.Body)
	}
}

func TestTrendsJSONWithoutTrends(t *testing.T) {
	t.Parallel()
	b := setup(t)
	if w := b.get(t, "/_idem/trends.json"); w.Code != 404 {
		t.Errorf("trends.json without trends: %d, want 404", w.Code)
	}
}

// Collect reads the unknown backlog and its oldest age from the store.
func TestCollect(t *testing.T) {
	t.Parallel()
	b := setup(t)
	unknown(t, b.store, testIdentity)
	b.clock.Advance(90 * time.Second)
	s := console.Collect(t.Context(), console.Config{Store: b.store, Outbox: b.outbox, Now: b.clock.Now,
		Decisions: func() map[string]float64 { return map[string]float64{"created": 3} }})
	if !s.Unknown || s.UnknownBacklog != 1 || s.OldestUnknown != 90*time.Second {
		t.Errorf("unknown %v %d %v, want 1 record 90s old", s.Unknown, s.UnknownBacklog, s.OldestUnknown)
	}
	if !s.Outbox || s.Decisions["created"] != 3 {
		t.Errorf("sample %+v", s)
	}
}

// A process younger than the charts' hour is charted over its own life, not
// as a sliver at the right of an hour, and the decision legend gives the
// decisions over the chart's span, which for a young process are the
// table's totals since it started (the first minute counts what was
// decided before the first sample, from zero).
func TestYoungProcessChartsSpanItsLife(t *testing.T) {
	t.Parallel()
	trends := console.NewTrends()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // setup's clock
	start := now.Add(-2*time.Minute - 50*time.Second)   // 11:57:10
	totals := map[string]float64{"created": 1, "replayed": 1}
	trends.Observe(start, console.Sample{Decisions: totals}) // the start-up demo came first
	totals = map[string]float64{"created": 3180, "replayed": 1}
	for _, at := range []time.Duration{30 * time.Second, time.Minute, 2 * time.Minute, 2*time.Minute + 50*time.Second} {
		trends.Observe(start.Add(at), console.Sample{Decisions: totals})
	}
	b := setup(t, func(c *console.Config) {
		c.Trends = trends
		c.Decisions = func() map[string]float64 { return totals }
	})
	page := b.get(t, "/_idem/").Body.String()
	chart := regexp.MustCompile(`(?s)<svg id="chart-decisions".*?</figure>`).FindString(page)
	if chart == "" {
		t.Fatal("no decisions chart")
	}
	var labels []string
	for _, m := range regexp.MustCompile(`text-anchor="(?:start|middle|end)">(\d\d:\d\d)</text>`).FindAllStringSubmatch(chart, -1) {
		labels = append(labels, m[1])
	}
	if got := strings.Join(labels, " "); got != "11:57 11:58 12:00" {
		t.Errorf("time axis %q, want 11:57 11:58 12:00: the process's four minutes", got)
	}
	if !strings.Contains(chart, `points="44.0,`) {
		t.Errorf("the lines do not start at the left edge:\n%s", chart)
	}
	if strings.Contains(chart, "last hour") {
		t.Errorf("a 3-minute-old process's chart says it shows the last hour")
	}
	if !strings.Contains(chart, `created <b>3180</b>`) || !strings.Contains(chart, `replayed <b>1</b>`) {
		t.Errorf("the legend does not give the decisions since the start:\n%s", chart)
	}
	if !regexp.MustCompile(`<td>created</td><td class="num">3180</td>`).MatchString(page) {
		t.Errorf("the table does not say 3180 created")
	}
}

// Decisions made since the last sample are charted too: the overview and
// trends.json read the totals the table shows, so a load run between two
// samples (every 10 s) is not missing from the chart and its legend.
func TestChartsCountDecisionsSinceTheLastSample(t *testing.T) {
	t.Parallel()
	trends := console.NewTrends()
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // setup's clock
	trends.Observe(now.Add(-65*time.Second), console.Sample{Decisions: map[string]float64{}})
	totals := map[string]float64{"created": 3179, "replayed": 1}
	b := setup(t, func(c *console.Config) {
		c.Trends = trends
		c.Decisions = func() map[string]float64 { return totals }
	})
	page := b.get(t, "/_idem/").Body.String()
	chart := regexp.MustCompile(`(?s)<svg id="chart-decisions".*?</figure>`).FindString(page)
	if !strings.Contains(chart, `created <b>3179</b>`) {
		t.Errorf("the legend misses the decisions since the last sample:\n%s", chart)
	}
	var got struct {
		Minutes []struct {
			At        time.Time          `json:"at"`
			Decisions map[string]float64 `json:"decisions"`
		} `json:"minutes"`
	}
	if err := json.Unmarshal(b.get(t, "/_idem/trends.json").Body.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	if n := len(got.Minutes); n != 2 || !got.Minutes[1].At.Equal(now) || got.Minutes[1].Decisions["created"] != 3179 {
		t.Errorf("trends.json minutes %+v, want 11:58 (sampled) and 12:00 with 3179 created", got.Minutes)
	}
}
