package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// waitSucceeded waits until the payment at base with id has succeeded.
func waitSucceeded(t *testing.T, base, token, id string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, base+"/v1/payments/"+id, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(body), `"status":"succeeded"`) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("payment %s did not succeed: %s", id, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// At the default level a payment costs at most one INFO line, though the
// relay and the provider work for it too; --log-level debug shows them, and
// --log-format json writes JSON.
func TestLogVolume(t *testing.T) {
	t.Parallel()
	const payments = 10
	count := func(args ...string) (info, debug int, stderr string) {
		e := newTestEnv(nil)
		base, stop := payCommand(t, e, payArgs(t, append([]string{"--tokens", "acme=" + payToken}, args...)...)...)
		before := e.stderr.String()
		for i := range payments {
			resp, body := postPayment(t, base, payToken, fmt.Sprintf("log-%d", i))
			if resp.StatusCode != http.StatusCreated {
				t.Fatalf("POST: %d %s", resp.StatusCode, body)
			}
			var p struct{ ID string }
			json.Unmarshal([]byte(body), &p)
			waitSucceeded(t, base, payToken, p.ID)
		}
		during := strings.TrimPrefix(e.stderr.String(), before)
		if code := stop(); code != ExitOK {
			t.Fatalf("exit %d: %s", code, e.stderr)
		}
		for _, line := range strings.Split(during, "\n") {
			switch {
			case strings.Contains(line, "level=INFO"), strings.Contains(line, `"level":"INFO"`):
				info++
			case strings.Contains(line, "level=DEBUG"), strings.Contains(line, `"level":"DEBUG"`):
				debug++
			}
		}
		return info, debug, during
	}
	info, debug, log := count()
	if info > payments || debug != 0 {
		t.Errorf("default level: %d INFO and %d DEBUG lines for %d payments, want at most one INFO each:\n%s", info, debug, payments, log)
	}
	_, debug, log = count("--log-level", "debug")
	if debug < payments || !strings.Contains(log, "provider: charged") {
		t.Errorf("--log-level debug: %d DEBUG lines, want the relay's and the provider's:\n%s", debug, log)
	}
	info, _, log = count("--log-format", "json")
	for _, line := range strings.Split(strings.TrimSpace(log), "\n") {
		if line != "" && !json.Valid([]byte(line)) {
			t.Errorf("--log-format json wrote %q", line)
		}
	}
	if info == 0 {
		t.Errorf("--log-format json: no INFO line:\n%s", log)
	}
	code, _, stderr := runCommand(t, map[string]string{"IDEM_LOG_LEVEL": "loud"}, "payments")
	if code != ExitUsage || !strings.Contains(stderr, `invalid value "loud" for IDEM_LOG_LEVEL`) {
		t.Errorf("a bad IDEM_LOG_LEVEL: exit %d, %s", code, stderr)
	}
}
