package console

import (
	"fmt"
	"html"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"
)

// The charts are SVG drawn on the server and inlined in the page: no
// script, no style attribute (the CSP allows neither), only presentation
// attributes.

// series is one line of a chart: a value per minute, NaN where the minute
// has no observation.
type series struct {
	Name   string
	Color  string
	Values []float64
	// Sum makes the legend give the sum of the values (counts per minute:
	// the count over the chart's span) rather than the last one (gauges).
	Sum bool
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH         = 600, 180
	chartLeft, chartRight  = 44, 8
	chartTop, chartBottom  = 10, 22
	chartPlotW, chartPlotH = chartW - chartLeft - chartRight, chartH - chartTop - chartBottom
)

// niceCeil returns a round number at least v (1, 2, 5 × 10^n), at least 1.
func niceCeil(v float64) float64 {
	if v <= 1 {
		return 1
	}
	exp := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*exp >= v {
			return m * exp
		}
	}
	return 10 * exp
}

// formatTick formats an axis value without needless decimals.
func formatTick(v float64) string {
	if v == math.Trunc(v) {
		return strconv.FormatFloat(v, 'f', 0, 64)
	}
	return strconv.FormatFloat(v, 'f', 1, 64)
}

// lineChart draws the series over the minutes ending with end (the last
// value is end's minute), with a legend. id names the chart for tests and
// links; label is its accessible name.
func lineChart(id, label string, end time.Time, ss []series) template.HTML {
	n := 0
	top := 0.0
	points := 0
	for _, s := range ss {
		n = max(n, len(s.Values))
		for _, v := range s.Values {
			if !math.IsNaN(v) {
				top = math.Max(top, v)
				points++
			}
		}
	}
	top = niceCeil(top)
	var b strings.Builder
	fmt.Fprintf(&b, `<figure class="chart"><svg id="%s" viewBox="0 0 %d %d" width="100%%" role="img" aria-label="%s" data-points="%d" xmlns="http://www.w3.org/2000/svg">`,
		html.EscapeString(id), chartW, chartH, html.EscapeString(label), points)
	fmt.Fprintf(&b, `<title>%s</title>`, html.EscapeString(label))
	// Grid and y axis: 0, half, top.
	for _, f := range []float64{0, 0.5, 1} {
		y := float64(chartTop) + float64(chartPlotH)*(1-f)
		fmt.Fprintf(&b, `<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#e3e6ea" stroke-width="1"/>`, chartLeft, y, chartW-chartRight, y)
		fmt.Fprintf(&b, `<text x="%d" y="%.1f" font-size="11" fill="#667085" text-anchor="end">%s</text>`, chartLeft-6, y+4, formatTick(top*f))
	}
	// X axis: the span's start, middle and end.
	span := max(n-1, 1)
	ticks := []int{0, span / 2, span}
	if span < 2 {
		ticks = []int{0, span}
	}
	for _, i := range ticks {
		x := float64(chartLeft) + float64(chartPlotW)*float64(i)/float64(span)
		t := end.Add(-time.Duration(span-i) * time.Minute).UTC().Format("15:04")
		anchor := "middle"
		switch i {
		case 0:
			anchor = "start"
		case span:
			anchor = "end"
		}
		fmt.Fprintf(&b, `<text x="%.1f" y="%d" font-size="11" fill="#667085" text-anchor="%s">%s</text>`, x, chartH-6, anchor, t)
	}
	xOf := func(i int) float64 { return float64(chartLeft) + float64(chartPlotW)*float64(i)/float64(span) }
	yOf := func(v float64) float64 { return float64(chartTop) + float64(chartPlotH)*(1-v/top) }
	for _, s := range ss {
		// One polyline per run of observed minutes; a lone point is a dot.
		var run []string
		flush := func() {
			switch {
			case len(run) == 1:
				xy := strings.Split(run[0], ",")
				fmt.Fprintf(&b, `<circle class="point" cx="%s" cy="%s" r="2.5" fill="%s"/>`, xy[0], xy[1], s.Color)
			case len(run) > 1:
				fmt.Fprintf(&b, `<polyline class="line" points="%s" fill="none" stroke="%s" stroke-width="2" stroke-linejoin="round"/>`, strings.Join(run, " "), s.Color)
			}
			run = run[:0]
		}
		for i, v := range s.Values {
			if math.IsNaN(v) {
				flush()
				continue
			}
			run = append(run, fmt.Sprintf("%.1f,%.1f", xOf(i+n-len(s.Values)), yOf(v)))
		}
		flush()
	}
	b.WriteString(`</svg><figcaption class="legend">`)
	for _, s := range ss {
		last := "—"
		if s.Sum {
			sum, seen := 0.0, false
			for _, v := range s.Values {
				if !math.IsNaN(v) {
					sum, seen = sum+v, true
				}
			}
			if seen {
				last = formatTick(math.Round(sum*10) / 10)
			}
		}
		for i := len(s.Values) - 1; i >= 0 && !s.Sum; i-- {
			if !math.IsNaN(s.Values[i]) {
				last = formatTick(math.Round(s.Values[i]*10) / 10)
				break
			}
		}
		fmt.Fprintf(&b, `<span><svg width="12" height="12" aria-hidden="true"><rect width="12" height="12" rx="2" fill="%s"/></svg> %s <b>%s</b></span> `,
			s.Color, html.EscapeString(s.Name), last)
	}
	b.WriteString(`</figcaption></figure>`)
	return template.HTML(b.String()) //nolint:gosec // built from numbers and escaped names
}
