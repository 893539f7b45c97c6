package cli

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idem-dev/idem"
)

// send makes a request to the proxy with an Idempotency-Key (unless
// empty), an X-Tenant header (unless empty) and a JSON body.
func send(t *testing.T, method, url, key, tenant string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(`{"amount":1}`))
	req.Header.Set("Content-Type", "application/json")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp, string(body)
}

// sendInBackground sends like send from another goroutine, where the test
// must not stop; the answer's status is delivered on the channel (0 on error).
func sendInBackground(method, url, key, tenant string) <-chan int {
	c := make(chan int, 1)
	go func() {
		req, _ := http.NewRequest(method, url, strings.NewReader(`{"amount":1}`))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Idempotency-Key", key)
		if tenant != "" {
			req.Header.Set("X-Tenant", tenant)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			c <- 0
			return
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		c <- resp.StatusCode
	}()
	return c
}

func problemCode(t *testing.T, body string) (code, typ string) {
	t.Helper()
	var p struct{ Code, Type string }
	if err := json.Unmarshal([]byte(body), &p); err != nil {
		t.Fatalf("not a problem: %q", body)
	}
	return p.Code, p.Type
}

// slowUpstream returns an upstream that tells arrived of each request and
// answers when release is called.
func slowUpstream(t *testing.T) (url string, arrived <-chan struct{}, release func()) {
	t.Helper()
	in := make(chan struct{}, 100)
	done := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		in <- struct{}{}
		select {
		case <-done:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusCreated)
	}))
	t.Cleanup(up.Close)
	var once atomic.Bool
	return up.URL, in, func() {
		if once.CompareAndSwap(false, true) {
			close(done)
		}
	}
}

// Every library safeguard has a flag of idem proxy, and the flag works.
func TestProxySafeguardFlags(t *testing.T) {
	t.Parallel()
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusCreated)
	}))
	// A cleanup, not a defer: it runs after the parallel subtests.
	t.Cleanup(up.Close)
	t.Run("min-key-length and problem-base-uri", func(t *testing.T) {
		t.Parallel()
		base, _, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--min-key-length", "8",
			"--problem-base-uri", "https://api.example/problems/")
		resp, body := send(t, "POST", base+"/x", "short", "")
		if code, typ := problemCode(t, body); resp.StatusCode != 400 || code != "key-invalid" || typ != "https://api.example/problems/key-invalid" {
			t.Errorf("a 5-character key: %d %s, want 400 key-invalid under the base", resp.StatusCode, body)
		}
		if resp, _ := send(t, "POST", base+"/x", "long-enough", ""); resp.StatusCode != 201 {
			t.Errorf("an 11-character key: %d, want 201", resp.StatusCode)
		}
	})
	t.Run("default problem type", func(t *testing.T) {
		t.Parallel()
		base, _, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--min-key-length", "8")
		_, body := send(t, "POST", base+"/x", "short", "")
		if _, typ := problemCode(t, body); typ != "https://github.com/idem-dev/idem#problem-key-invalid" {
			t.Errorf("type = %q, want the README anchor", typ)
		}
	})
	t.Run("async", func(t *testing.T) {
		t.Parallel()
		slow, arrived, release := slowUpstream(t)
		base, _, _ := startProxy(t, "--upstream", slow, "--store", "memory:", "--async")
		t.Cleanup(release) // before the proxy stops: its drain waits for the upstream
		first := sendInBackground("POST", base+"/slow", "async-key", "")
		<-arrived
		resp, _ := send(t, "POST", base+"/slow", "async-key", "")
		if resp.StatusCode != http.StatusAccepted || resp.Header.Get("Retry-After") == "" {
			t.Errorf("duplicate in progress: %d (Retry-After %q), want 202 with Retry-After", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
		release()
		if code := <-first; code != http.StatusCreated {
			t.Errorf("first request: %d, want 201", code)
		}
	})
	t.Run("max-in-progress-per-scope", func(t *testing.T) {
		t.Parallel()
		slow, arrived, release := slowUpstream(t)
		base, _, _ := startProxy(t, "--upstream", slow, "--store", "memory:", "--scope-header", "X-Tenant",
			"--max-in-progress-per-scope", "1")
		t.Cleanup(release)
		first := sendInBackground("POST", base+"/slow", "first", "acme")
		<-arrived
		resp, body := send(t, "POST", base+"/x", "second", "acme")
		if code, _ := problemCode(t, body); resp.StatusCode != http.StatusTooManyRequests || code != "too-many-keys" {
			t.Errorf("a second key while one is in progress: %d %s, want 429 too-many-keys", resp.StatusCode, body)
		}
		// Another tenant is not limited.
		other := sendInBackground("POST", base+"/x", "other", "globex")
		<-arrived
		release()
		if code := <-other; code != http.StatusCreated {
			t.Errorf("another tenant: %d, want 201", code)
		}
		if code := <-first; code != http.StatusCreated {
			t.Errorf("first request: %d, want 201", code)
		}
	})
	t.Run("new-keys-per-second-per-scope and metrics-tenant-label", func(t *testing.T) {
		t.Parallel()
		base, e, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--scope-header", "X-Tenant",
			"--new-keys-per-second-per-scope", "0.01", "--metrics-tenant-label", "--ops-listen", "127.0.0.1:0")
		if resp, _ := send(t, "POST", base+"/x", "rate-1", "acme"); resp.StatusCode != 201 {
			t.Fatalf("first key: %d, want 201", resp.StatusCode)
		}
		resp, body := send(t, "POST", base+"/x", "rate-2", "acme")
		if code, _ := problemCode(t, body); resp.StatusCode != 429 || code != "too-many-keys" || resp.Header.Get("Retry-After") == "" {
			t.Errorf("second new key at once: %d %s, want 429 too-many-keys with Retry-After", resp.StatusCode, body)
		}
		m := regexp.MustCompile(`ops_addr=(\S+)`).FindStringSubmatch(e.stderr.String())
		if m == nil {
			t.Fatalf("no ops address in the log:\n%s", e.stderr)
		}
		mresp, err := http.Get("http://" + m[1] + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		metrics, _ := io.ReadAll(mresp.Body)
		mresp.Body.Close()
		sum := sha256.Sum256([]byte("acme"))
		if want := `tenant="` + hex.EncodeToString(sum[:]) + `"`; !strings.Contains(string(metrics), want) {
			t.Errorf("/metrics has no %s:\n%s", want, metrics)
		}
	})
	t.Run("appstrate covers PUT and DELETE", func(t *testing.T) {
		t.Parallel()
		base, _, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--profile", "appstrate")
		for _, method := range []string{"PUT", "DELETE"} {
			send(t, method, base+"/x", "k-"+method, "")
			if resp, _ := send(t, method, base+"/x", "k-"+method, ""); resp.Header.Get("Idempotent-Replayed") != "true" {
				t.Errorf("%s retried: not replayed", method)
			}
		}
	})
}

// slowRequest sends head and then its body a byte every 20 ms over a real
// connection, and returns the answer and how long it took. The trickle
// stops when the server answers or closes.
func slowRequest(t *testing.T, addr, head string) (*http.Response, time.Duration) {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	start := time.Now()
	io.WriteString(conn, head)
	go func() {
		for range 1000 {
			if _, err := io.WriteString(conn, "{"); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return nil, time.Since(start)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp, time.Since(start)
}

// --body-timeout bounds a slow body: a protected request gets 408 and its
// key stays free; a request the proxy does not protect is cut off too,
// instead of holding the connection for as long as the client likes.
func TestProxyBodyTimeout(t *testing.T) {
	t.Parallel()
	var calls atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusCreated)
	}))
	defer up.Close()
	base, _, _ := startProxy(t, "--upstream", up.URL, "--store", "memory:", "--body-timeout", "300ms")
	addr := strings.TrimPrefix(base, "http://")

	resp, took := slowRequest(t, addr, "POST /v1/pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n")
	if resp == nil || resp.StatusCode != http.StatusRequestTimeout || resp.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("slow protected body: %v after %s, want 408 problem+json", resp, took)
	}
	if took > 10*time.Second {
		t.Errorf("answered after %s, want about 300ms", took)
	}
	if r, _ := send(t, "POST", base+"/v1/pay", "slow", ""); r.StatusCode != http.StatusCreated {
		t.Errorf("the same key sent promptly: %d, want 201 (the slow body must not have held it)", r.StatusCode)
	}

	// A protected request the middleware refuses before reading its body
	// (a key too long): the body left over is bounded too.
	long := strings.Repeat("k", idem.MaxKeyLength+1)
	resp, took = slowRequest(t, addr, "POST /v1/pay HTTP/1.1\r\nHost: x\r\nIdempotency-Key: "+long+"\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n")
	if resp == nil || resp.StatusCode != http.StatusBadRequest {
		t.Errorf("slow body with an invalid key: %v after %s, want 400", resp, took)
	}
	if took > 10*time.Second {
		t.Errorf("slow body with an invalid key held the connection %s, want it cut off at about 300ms", took)
	}

	// PUT is not protected: it streams to the upstream, and is cut off.
	resp, took = slowRequest(t, addr, "PUT /v1/pay HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n\r\n")
	if resp != nil && resp.StatusCode < 400 {
		t.Errorf("slow unprotected body: %d, want a failure", resp.StatusCode)
	}
	if took > 10*time.Second {
		t.Errorf("slow unprotected body held the connection %s, want it cut off at about 300ms", took)
	}
}

// idem payments takes the safeguards that apply to it, from flags or
// variables, and its middleware enforces them.
func TestPaymentsSafeguardFlags(t *testing.T) {
	t.Parallel()
	e := newTestEnv(map[string]string{"IDEM_NEW_KEYS_PER_SECOND_PER_SCOPE": "0.01"})
	base, _ := payCommand(t, e, payArgs(t, "--tokens", "acme="+payToken+",globex="+payOtherToken,
		"--min-key-length", "8", "--max-in-progress-per-scope", "3", "--body-timeout", "5s", "--metrics-tenant-label")...)
	resp, body := postPayment(t, base, payToken, "short")
	if code, typ := problemCode(t, body); resp.StatusCode != 400 || code != "key-invalid" || typ != "https://github.com/idem-dev/idem#problem-key-invalid" {
		t.Errorf("a 5-character key: %d %s, want 400 key-invalid", resp.StatusCode, body)
	}
	if resp, body := postPayment(t, base, payToken, "payment-1"); resp.StatusCode != http.StatusCreated {
		t.Fatalf("first payment: %d %s", resp.StatusCode, body)
	}
	resp, body = postPayment(t, base, payToken, "payment-2")
	if code, _ := problemCode(t, body); resp.StatusCode != 429 || code != "too-many-keys" {
		t.Errorf("a second new key at once (IDEM_NEW_KEYS_PER_SECOND_PER_SCOPE=0.01): %d %s, want 429", resp.StatusCode, body)
	}
	if resp, body := postPayment(t, base, payOtherToken, "payment-1"); resp.StatusCode != http.StatusCreated {
		t.Errorf("another tenant: %d %s, want 201", resp.StatusCode, body)
	}
}
