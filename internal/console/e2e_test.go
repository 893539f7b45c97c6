package console_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/idem-dev/idem/idemstore"
	"github.com/idem-dev/idem/internal/console"
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

	b := setup(t, func(c *console.Config) {
		c.Decisions = func() map[string]float64 {
			return map[string]float64{"created": 42, "replayed": 7, "unknown": 1, "in_progress": 2}
		}
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
