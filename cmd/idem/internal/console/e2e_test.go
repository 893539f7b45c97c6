package console_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem/cmd/idem/internal/console"
	"github.com/idem-dev/idem/idemstore"
)

// chromium returns the path of a Chromium binary, skipping the test when
// there is none (failing it when IDEM_TEST_REQUIRE_ALL=1).
func chromium(t *testing.T) string {
	t.Helper()
	candidates := []string{os.Getenv("IDEM_TEST_CHROMIUM"), "chromium", "chromium-browser", "google-chrome", "headless-shell"}
	for _, c := range candidates {
		if c == "" {
			continue
		}
		if p, err := exec.LookPath(c); err == nil {
			return p
		}
	}
	msg := "chromium not found (install Debian's chromium package, or set IDEM_TEST_CHROMIUM to a Chrome binary)"
	if os.Getenv("IDEM_TEST_REQUIRE_ALL") == "1" {
		t.Fatal(msg + "; IDEM_TEST_REQUIRE_ALL=1 makes this a failure")
	}
	t.Skip(msg)
	return ""
}

// artifactDir returns the directory for the screenshots: IDEM_TEST_ARTIFACTS
// when set (kept after the test), else a temporary directory.
func artifactDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if root := os.Getenv("IDEM_TEST_ARTIFACTS"); root != "" {
		dir = filepath.Join(root, "console")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("console screenshots: %s", dir)
	return dir
}

// TestConsoleInChromium drives the console in headless Chromium the way an
// operator does: sign in, read the overview, open the unknown queue and a
// key, resolve it, see the state change; then retry a dead letter. Every
// page is kept as a screenshot.
func TestConsoleInChromium(t *testing.T) {
	t.Parallel()
	exe := chromium(t)
	dir := artifactDir(t)

	trends := console.NewTrends()
	start := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC) // setup's clock
	totals := feedTrends(trends, start)
	b := setup(t, func(c *console.Config) {
		c.Trends = trends
		c.Decisions = func() map[string]float64 { return totals }
		c.Stats = func(context.Context) []console.Stat {
			return []console.Stat{
				{Name: "Unknown backlog", Value: "1", Warn: true},
				{Name: "Oldest in-progress lease", Value: "0s"},
				{Name: "Last sweep", Value: "12s ago"},
			}
		}
	})
	unknown(t, b.store, testIdentity)
	for _, k := range []string{"order-1001", "order-1002", "order-1003"} {
		completed(t, b.store, idemstore.Identity{Scope: "tenant-a", Endpoint: "POST /v1/payments", Key: k},
			&idemstore.Response{Status: 201, Header: http.Header{"Content-Type": {"application/json"}}, Body: []byte(`{"id":"pay_` + k + `"}`)})
	}
	reserve(t, b.store, idemstore.Identity{Scope: "tenant-b", Endpoint: "POST /v1/refunds", Key: "refund-77"})
	b.outbox.add(console.OutboxMessage{Topic: "provider.charge", IdempotencyKey: "charge-3f9a", State: "pending", Attempts: 1,
		AvailableAt: b.clock.Now().Add(30 * time.Second), Payload: []byte(`{"amount_cents":1200}`)})
	b.outbox.add(console.OutboxMessage{Topic: "provider.charge", IdempotencyKey: "charge-77b1", State: "dead", Attempts: 8,
		AvailableAt: b.clock.Now().Add(-time.Hour), LastError: "provider answered 502 Bad Gateway", Payload: []byte(`{"amount_cents":900}`)})

	mux := http.NewServeMux()
	mux.Handle("/_idem/", b.handler)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(exe),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1200, 900),
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("no-first-run", true),
	)
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(ctx, opts...)
	defer cancelAlloc()
	browser, cancelBrowser := chromedp.NewContext(allocCtx, chromedp.WithLogf(t.Logf))
	defer cancelBrowser()

	shot := func(name string) chromedp.Action[chromedp.Void] {
		return chromedp.Func(func(ctx context.Context, tg *chromedp.Target) error {
			png, err := chromedp.FullScreenshot(100)(ctx, tg)
			if err != nil {
				return err
			}
			path := filepath.Join(dir, name+".png")
			t.Logf("screenshot %s", path)
			return os.WriteFile(path, png, 0o644)
		})
	}
	run := func(step string, actions ...chromedp.Action[chromedp.Void]) {
		t.Helper()
		if err := chromedp.Do(browser, actions...); err != nil {
			t.Fatalf("%s: %v", step, err)
		}
	}
	text := func(sel string) string {
		t.Helper()
		s, err := chromedp.Run(browser, chromedp.Text(chromedp.CSS(sel)))
		if err != nil {
			t.Fatalf("read %s: %v", sel, err)
		}
		return strings.TrimSpace(s)
	}

	// Signing in: the console answers 401 with its login form.
	run("open the console",
		chromedp.Navigate(srv.URL+"/_idem/"),
		chromedp.WaitVisible(chromedp.ID("token")),
		shot("01-login"),
	)
	run("sign in",
		chromedp.SendKeys(chromedp.ID("token"), testToken),
		chromedp.Click(chromedp.CSS(`button[type="submit"]`)),
		chromedp.WaitVisible(chromedp.ID("count-unknown")),
		shot("02-overview"),
	)
	if got := text("#count-unknown"); got != "1" {
		t.Fatalf("overview: %s unknown records, want 1", got)
	}
	if got := text("#count-completed"); got != "3" {
		t.Fatalf("overview: %s completed records, want 3", got)
	}
	// The charts are drawn, with data: a line per decision kind across the
	// hour, and the outbox and unknown lines.
	for _, chart := range []struct {
		id    string
		lines int
	}{{"chart-decisions", 5}, {"chart-outbox", 2}, {"chart-unknown", 2}} {
		n, err := chromedp.Run(browser, chromedp.Evaluate[int](`document.querySelectorAll("#`+chart.id+` polyline.line").length`))
		if err != nil {
			t.Fatalf("counting the lines of %s: %v", chart.id, err)
		}
		if n < chart.lines {
			t.Errorf("%s draws %d lines, want at least %d", chart.id, n, chart.lines)
		}
		w, err := chromedp.Run(browser, chromedp.Evaluate[float64](`Math.max(...[...document.querySelectorAll("#`+chart.id+` polyline.line")].map(l => l.getBoundingClientRect().width))`))
		if err != nil {
			t.Fatalf("measuring %s: %v", chart.id, err)
		}
		if w < 100 {
			t.Errorf("%s: its widest line is %.0f px wide on screen, want the hour drawn across the chart", chart.id, w)
		}
	}
	if got := text("#chart-decisions + .legend"); !strings.Contains(got, "replayed") || !strings.Contains(got, "store errors (503)") {
		t.Errorf("decision chart legend %q", got)
	}
	if got := text(".card .muted"); got == "" {
		t.Errorf("no explanation under the charts")
	}
	screenshotForREADME(t, browser)

	// The unknown queue, then the key.
	run("open the unknown queue",
		chromedp.Click(chromedp.CSS(`nav a[href="/_idem/unknown"]`)),
		chromedp.WaitVisible(chromedp.CSS("a.key")),
		shot("03-unknown-queue"),
	)
	if got := text("a.key"); got != testIdentity.Key {
		t.Fatalf("unknown queue lists %q, want %q", got, testIdentity.Key)
	}
	run("open the key",
		chromedp.Click(chromedp.CSS("a.key")),
		chromedp.WaitVisible(chromedp.ID("resolve-completed")),
		shot("04-key-unknown"),
	)
	if got := text("#state"); got != "unknown" {
		t.Fatalf("key page state %q, want unknown", got)
	}

	// Resolve it as completed with the response the downstream confirmed.
	run("resolve the key",
		chromedp.SetValue(chromedp.ID("status"), "201"),
		chromedp.SendKeys(chromedp.ID("body"), `{"id":"pay_confirmed"}`),
		chromedp.Click(chromedp.ID("resolve-completed")),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
		shot("05-key-resolved"),
	)
	if got := text("#state"); got != "completed" {
		t.Fatalf("after resolving, the page shows %q, want completed", got)
	}
	if got := text("#resp-body"); got != `{"id":"pay_confirmed"}` {
		t.Fatalf("after resolving, the stored body shows %q", got)
	}
	rec := getRecord(t, b.store, testIdentity)
	if rec.State != idemstore.StateCompleted || rec.Response == nil || rec.Response.Status != 201 || string(rec.Response.Body) != `{"id":"pay_confirmed"}` {
		t.Fatalf("the store holds %s %+v, want completed 201", rec.State, rec.Response)
	}

	run("back to the overview",
		chromedp.Click(chromedp.CSS(`nav a[href="/_idem/"]`)),
		chromedp.WaitVisible(chromedp.ID("count-unknown")),
		shot("06-overview-after"),
	)
	if got := text("#count-unknown"); got != "0" {
		t.Fatalf("overview after resolving: %s unknown, want 0", got)
	}

	// Retry a dead letter.
	run("open the dead letters",
		chromedp.Navigate(srv.URL+"/_idem/outbox?state=dead"),
		chromedp.WaitVisible(chromedp.CSS(`form[action="/_idem/outbox/retry"] button`)),
		shot("07-dead-letters"),
		chromedp.Click(chromedp.CSS(`form[action="/_idem/outbox/retry"] button`)),
		chromedp.WaitVisible(chromedp.CSS(".flash")),
		shot("08-dead-letter-retried"),
	)
	if s := b.outbox.state(2); s != "pending" {
		t.Fatalf("dead letter state %s after retry, want pending", s)
	}
	if logs := b.logs.String(); !strings.Contains(logs, "action=resolve") || !strings.Contains(logs, "action=outbox_retry") ||
		strings.Contains(logs, testIdentity.Key) || strings.Contains(logs, "request refused") {
		t.Fatalf("the log is wrong:\n%s", logs)
	}
}

// feedTrends observes an hour of made-up traffic ending at now: steady
// creations, a client retrying in a loop for the last 15 minutes, a burst
// of store errors, an outbox that backs up and drains, and an unknown
// record that appears 10 minutes before now. It returns the last totals.
func feedTrends(tr *console.Trends, now time.Time) map[string]float64 {
	totals := map[string]float64{}
	add := func(name string, n float64) { totals[name] += n }
	for i := range 60 {
		at := now.Add(-time.Duration(59-i) * time.Minute)
		add("created", 30+float64(i%7)*3)
		add("replayed", 4+float64(i%3))
		if i >= 45 {
			add("replayed", float64(i-44)*6)
		}
		add("in_progress", float64(i%4))
		if i%17 == 5 {
			add("key_reused", 2)
		}
		if i >= 20 && i < 24 {
			add("store_error", 25)
		}
		s := console.Sample{Decisions: maps.Clone(totals), Outbox: true, Unknown: true}
		switch {
		case i < 20:
			s.OutboxDepth = 2 + i%3
		case i < 30:
			s.OutboxDepth = 2 + (i-19)*4
		default:
			s.OutboxDepth = max(2, 42-(i-30)*3)
		}
		if i >= 27 {
			s.DeadLetters = 1
		}
		if i >= 50 {
			s.UnknownBacklog, s.OldestUnknown = 1, time.Duration(i-49)*time.Minute
		}
		tr.Observe(at, s)
	}
	return totals
}

// screenshotPath is the README's screenshot of the console, taken by
// TestConsoleInChromium; screenshotSum beside it holds the hash of the page
// sources it shows.
const (
	screenshotPath = "../../../../docs/console.png"
	screenshotSum  = "../../../../docs/console.png.sources"
)

// pageSourcesHash hashes what the overview is drawn from: the templates, the
// style sheet and the chart code. When it changes, the screenshot must be
// taken again.
func pageSourcesHash(t *testing.T) string {
	t.Helper()
	h := sha256.New()
	files, err := filepath.Glob("templates/*.html")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files)
	for _, f := range append(files, "render.go", "chart.go", "trends.go") {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(h, "%s %d\n", f, len(b))
		h.Write(b)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// screenshotForREADME keeps the README's screenshot in step with the
// pages: with IDEM_UPDATE_SCREENSHOT=1 it takes the overview's screenshot
// into docs/console.png and records the sources' hash; otherwise it fails
// when the pages changed since the screenshot was taken.
func screenshotForREADME(t *testing.T, browser context.Context) {
	t.Helper()
	sum := pageSourcesHash(t)
	if os.Getenv("IDEM_UPDATE_SCREENSHOT") != "1" {
		recorded, err := os.ReadFile(screenshotSum)
		if err != nil || strings.TrimSpace(string(recorded)) != sum {
			t.Errorf("the console's pages changed since docs/console.png was taken: run IDEM_UPDATE_SCREENSHOT=1 go test ./internal/console -run TestConsoleInChromium and commit docs/console.png and docs/console.png.sources")
		}
		return
	}
	png, err := chromedp.Run(browser, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	if err := os.WriteFile(screenshotPath, png, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(screenshotSum, []byte(sum+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", screenshotPath)
}
